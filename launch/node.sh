#!/usr/bin/env bash
# One host's part of a cluster run. tpu.sh and gpu.sh call it over ssh on every
# host; it is also how to start a Ray node or a training process by hand.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

USAGE="Usage: launch/node.sh ACTION [options] [-- extra arguments]

Runs on one host of a cluster, from the rollx checkout it lives in.

Actions:
  ray-start  start this host's Ray node: the head on host 0, a worker that joins
             it elsewhere (extra arguments go to 'ray start', e.g. --num-cpus=8)
  ray-stop   stop this host's Ray node ('ray stop': every Ray process of the user)
  train      python -m rollx.train on this host as JAX process INDEX of NUM-HOSTS
             (extra arguments go to rollx.train, e.g. --config=configs/frozenlake.py)
  info       print this host's index, the number of hosts and the head's address

Where the host sits: --index, --num-hosts and --head-address, or --tpu to read
them from the Cloud TPU VM metadata server (what JAX itself does on a TPU pod).

Example (two GPU hosts, 10.0.0.1 the head):
  launch/node.sh ray-start --index=0 --num-hosts=2 --head-address=10.0.0.1   # on 10.0.0.1
  launch/node.sh ray-start --index=1 --num-hosts=2 --head-address=10.0.0.1   # on 10.0.0.2
  launch/node.sh train --index=I --num-hosts=2 --head-address=10.0.0.1 -- --config=configs/frozenlake.py"

opt index "" "this host's index; 0 is the Ray head and the JAX coordinator"
opt num-hosts "" "number of hosts (JAX processes)"
opt head-address "" "host 0's address, reachable from every host"
flag tpu "take index, hosts and head address from the TPU VM metadata server"
opt ray-port 6379 "Ray head (GCS) port"
opt jax-port 8476 "jax.distributed coordinator port (on host 0)"
opt head-resources '{"rollx_head": 1}' "ray-start: custom resources of the head node (JSON)"
opt worker-resources '{"rollx_worker": 1}' "ray-start: custom resources of the other nodes (JSON)"
opt actor-platforms cpu "ray-start: JAX_PLATFORMS of the Ray actors here; cpu keeps env workers off the accelerators the trainer holds ('' = JAX picks)"
opt ray-auth-mode token "RAY_AUTH_MODE of Ray nodes and the trainer: token (each host needs the same ~/.ray/auth_token; tpu.sh/gpu.sh setup copies it) or disabled"
opt only "" "ray-start: 'head' or 'workers' to start only that part"
opt python .venv/bin/python "the rollx environment's python (relative to the checkout)"
opt log "" "train: also append the output to this file"
flag detach "train: run in the background (nohup) with output to --log"
flag no-ray "train: do not join the Ray cluster (a private local Ray instead)"
parse_args "$@"
[[ ${#POSITIONAL[@]} == 1 ]] || die "expected one ACTION (see --help), got: ${POSITIONAL[*]-nothing}"
ACTION=${POSITIONAL[0]}
cd "$ROLLX_ROOT"

tpu_metadata() {
  curl -sf -H 'Metadata-Flavor: Google' \
    "http://${GCE_METADATA_IP:-metadata.google.internal}/computeMetadata/v1/instance/attributes/$1" ||
    die "cannot read TPU metadata '$1' (is this a Cloud TPU VM?)"
}

locate() {
  if [[ "$(get tpu)" == 1 ]]; then
    # worker-network-endpoints: "host,host,..." or "name:id:ip,..." (older images)
    local endpoints first
    endpoints=$(tpu_metadata worker-network-endpoints)
    first=${endpoints%%,*}
    [[ "$first" == *:*:* ]] && first=${first##*:}
    INDEX=$(tpu_metadata agent-worker-number)
    NUM_HOSTS=$(echo "$endpoints" | tr ',' '\n' | grep -c .)
    HEAD=$first
  else
    require index num-hosts head-address
    INDEX=$(get index) NUM_HOSTS=$(get num-hosts) HEAD=$(get head-address)
  fi
  [[ "$INDEX" =~ ^[0-9]+$ && "$NUM_HOSTS" =~ ^[0-9]+$ ]] ||
    die "--index and --num-hosts must be integers, got '$INDEX' and '$NUM_HOSTS'"
  ((INDEX < NUM_HOSTS)) || die "--index=$INDEX is not below --num-hosts=$NUM_HOSTS"
}

PY=$(get python)
RAY="$(dirname "$PY")/ray"

ray_start() {
  locate
  # RAY_worker_niceness=0: the actors run at the trainer's priority, not Ray's nice 15
  # (on busy cores a niced env worker took minutes to restart; rollx/cluster.py)
  local only platforms tunables env=(env RAY_USAGE_STATS_ENABLED=0 RAY_worker_niceness=0
                                     "RAY_AUTH_MODE=$(get ray-auth-mode)")
  only=$(get only)
  [[ -z "$only" || "$only" == head || "$only" == workers ]] || die "--only must be head or workers"
  platforms=$(get actor-platforms)
  [[ -n "$platforms" ]] && env+=("JAX_PLATFORMS=$platforms")
  # The actors (JetStream servers, env workers) are the raylet's children and inherit
  # its environment, not the trainer's: give them the malloc tuning rollx.train
  # re-executes itself with (rollx/hostmem.py; ROLLX_MALLOC_TUNING=0 opts out).
  tunables=$("$PY" -m rollx.hostmem) || die "cannot run $PY -m rollx.hostmem (--python?)"
  [[ -n "$tunables" ]] && env+=("GLIBC_TUNABLES=$tunables")
  if [[ "$INDEX" == 0 ]]; then
    [[ "$only" == workers ]] && return 0
    run "${env[@]}" "$RAY" start --head --node-ip-address="$HEAD" --port="$(get ray-port)" \
      --resources="$(get head-resources)" --include-dashboard=false --disable-usage-stats \
      ${EXTRA[@]+"${EXTRA[@]}"}
  else
    [[ "$only" == head ]] && return 0
    run "${env[@]}" "$RAY" start --address="$HEAD:$(get ray-port)" \
      --resources="$(get worker-resources)" --disable-usage-stats ${EXTRA[@]+"${EXTRA[@]}"}
  fi
}

train() {
  locate
  local cmd args=(${EXTRA[@]+"${EXTRA[@]}"}) log ray_env=()
  if [[ "$(get no-ray)" == 0 ]]; then
    _is_in --config.ray_address ${args[@]+"${args[@]%%=*}"} ||
      args+=("--config.ray_address=$HEAD:$(get ray-port)")
    ray_env=("RAY_AUTH_MODE=$(get ray-auth-mode)")
  fi
  # rollx.parallel.distributed reads these; one process per host.
  cmd=(env "ROLLX_COORDINATOR_ADDRESS=$HEAD:$(get jax-port)" "ROLLX_NUM_PROCESSES=$NUM_HOSTS"
    "ROLLX_PROCESS_ID=$INDEX" ${ray_env[@]+"${ray_env[@]}"} "$PY" -m rollx.train
    ${args[@]+"${args[@]}"})
  log=$(get log)
  if [[ "$(get detach)" == 1 ]]; then
    [[ -n "$log" ]] || die "--detach needs --log"
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "mkdir -p $(quote "$(dirname "$log")")"
      echo "nohup $(quote "${cmd[@]}") >> $(quote "$log") 2>&1 &"
    else
      mkdir -p "$(dirname "$log")"
      nohup "${cmd[@]}" >>"$log" 2>&1 &
      echo "$PROG: training started (pid $!), output in $ROLLX_ROOT/$log"
    fi
  elif [[ -n "$log" ]]; then
    [[ "$DRY_RUN" == 1 ]] || mkdir -p "$(dirname "$log")"
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "$(quote "${cmd[@]}") 2>&1 | tee -a $(quote "$log")"
    else
      "${cmd[@]}" 2>&1 | tee -a "$log"
    fi
  else
    run "${cmd[@]}"
  fi
}

case "$ACTION" in
  ray-start) ray_start ;;
  ray-stop) run "$RAY" stop ;;
  train) train ;;
  info) locate; echo "index=$INDEX num_hosts=$NUM_HOSTS head=$HEAD" ;;
  *) die "unknown action '$ACTION' (see --help)" ;;
esac
