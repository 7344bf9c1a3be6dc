#!/usr/bin/env bash
# rollx on a list of GPU (or any) hosts reachable over ssh: set up, Ray, train, logs.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

USAGE="Usage: launch/gpu.sh ACTION --hosts=H0,H1,... [options] [-- rollx.train args]

The first host is the Ray head and the JAX coordinator; every host needs ssh
access (keys, no password) and reaches the first one at --head-address.

Actions (in the order of a run):
  setup       copy this checkout (or clone --git-repo) to every host, install rollx there
  ray-start   Ray head on the first host, Ray workers on the others
  train       python -m rollx.train on every host (one JAX process per host), detached;
              then follow the first host's log (Ctrl-C stops following, not training)
  logs        follow host number --worker's training log
  fetch-logs  copy the first host's TensorBoard logs to --dest
  ray-stop    stop Ray on every host

Example:
  launch/gpu.sh setup --hosts=10.0.0.1,10.0.0.2 --user=ubuntu
  launch/gpu.sh ray-start --hosts=10.0.0.1,10.0.0.2 --user=ubuntu
  launch/gpu.sh train --hosts=10.0.0.1,10.0.0.2 --user=ubuntu -- --config=configs/frozenlake.py"

opt hosts "" "comma-separated ssh host names or IPs; the first is the head (required)"
opt user "" "ssh user (default: ssh's own choice)"
opt ssh-opts "-o BatchMode=yes" "options for every ssh/scp call (split on spaces)"
opt head-address "" "the first host's address as the others reach it (default: its name in --hosts)"
opt dir rollx "checkout on each host, relative to the home directory"
opt git-repo "" "setup: clone this repository instead of copying this checkout"
opt git-ref main "setup: branch, tag or commit of --git-repo"
opt python python3.11 "setup: python used to create DIR/.venv (must exist on the hosts)"
opt jax-extra "jax[cuda12]" "setup: the JAX build for the accelerator"
opt head-resources '{"rollx_head": 1}' "ray-start: custom resources of the head's Ray node (JSON)"
opt worker-resources '{"rollx_worker": 1}' "ray-start: custom resources of the other Ray nodes (JSON)"
opt actor-platforms cpu "ray-start: JAX_PLATFORMS of Ray actors ('' = JAX picks: servers on GPUs)"
opt log output/train.log "train: training output, relative to DIR on each host"
flag no-follow "train: do not follow the first host's log"
opt worker 0 "logs: which host's log (its position in --hosts)"
opt logging-dir output/logs "fetch-logs: the run's logging_dir, relative to DIR"
opt dest ./gpu-logs "fetch-logs: local destination"
parse_args "$@"
[[ ${#POSITIONAL[@]} == 1 ]] || die "expected one ACTION (see --help), got: ${POSITIONAL[*]-nothing}"
ACTION=${POSITIONAL[0]}
require hosts
IFS=, read -r -a HOSTS <<<"$(get hosts)"
[[ ${#HOSTS[@]} -gt 0 ]] || die "--hosts is empty"
HEAD=$(get head-address)
HEAD=${HEAD:-${HOSTS[0]}}
DIR=$(get dir)
read -r -a SSH_OPTS <<<"$(get ssh-opts)"

target() { if [[ -n "$(get user)" ]]; then echo "$(get user)@$1"; else echo "$1"; fi; }

# on_each CMD_FOR_INDEX: runs "$(CMD_FOR_INDEX i)" on every host i at once.
on_each() {
  local i
  for i in "${!HOSTS[@]}"; do
    queue ssh ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} "$(target "${HOSTS[$i]}")" "$("$1" "$i")"
  done
  run_parallel
}

node_cmd() {  # node_cmd INDEX ACTION ARG...: launch/node.sh on host INDEX
  local index=$1 action=$2
  shift 2
  echo "cd $DIR && bash launch/node.sh $(quote "$action" --index="$index" \
    --num-hosts="${#HOSTS[@]}" --head-address="$HEAD" "$@")"
}

setup_cmd() {
  local py fetch
  py=$(get python)
  if [[ -n "$(get git-repo)" ]]; then
    fetch="(test -d $DIR/.git || git clone -q $(quote "$(get git-repo)") $DIR) && cd $DIR && git fetch -q origin $(quote "$(get git-ref)") && git checkout -q --detach FETCH_HEAD"
  else
    fetch="mkdir -p $DIR && tar -xzf rollx-src.tgz -C $DIR && cd $DIR"
  fi
  echo "set -e; $INSTALL_RAY_TOKEN && $fetch && $py -m venv .venv && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e . $(quote "$(get jax-extra)") tensorboard"
}

setup() {
  local h tarball=${TMPDIR:-/tmp}/rollx-src.tgz copy=0
  [[ -z "$(get git-repo)" ]] && copy=1
  ensure_ray_token
  if [[ $copy == 1 ]]; then
    # The working tree as it is (uncommitted edits included), without build outputs.
    run tar -czf "$tarball" -C "$ROLLX_ROOT" --exclude=./.venv --exclude=./output \
      --exclude=.git --exclude=__pycache__ --exclude='*.egg-info' .
  fi
  for h in "${HOSTS[@]}"; do
    queue scp ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} "$RAY_TOKEN_FILE" "$(target "$h"):rollx-ray-token"
    [[ $copy == 0 ]] || queue scp ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} "$tarball" "$(target "$h"):rollx-src.tgz"
  done
  run_parallel
  on_each setup_cmd
}

ray_head_cmd() { node_cmd "$1" ray-start --only=head --head-resources="$(get head-resources)" \
  --actor-platforms="$(get actor-platforms)"; }
ray_workers_cmd() { node_cmd "$1" ray-start --only=workers \
  --worker-resources="$(get worker-resources)" --actor-platforms="$(get actor-platforms)"; }
ray_stop_cmd() { node_cmd "$1" ray-stop; }
train_cmd() { node_cmd "$1" train --detach --log="$(get log)" -- "${EXTRA[@]}"; }

logs() {
  local i
  i=$(get worker)
  [[ "$i" =~ ^[0-9]+$ && $i -lt ${#HOSTS[@]} ]] || die "--worker=$i is not a position in --hosts"
  run ssh ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} "$(target "${HOSTS[$i]}")" "tail -n +1 -F $DIR/$(get log)"
}

case "$ACTION" in
  setup) setup ;;
  ray-start)
    # The head first: workers that start before it would give up joining.
    run ssh ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} "$(target "${HOSTS[0]}")" "$(ray_head_cmd 0)"
    on_each ray_workers_cmd
    ;;
  ray-stop) on_each ray_stop_cmd ;;
  train)
    [[ ${#EXTRA[@]} -gt 0 ]] || die "missing rollx.train arguments after --, e.g. -- --config=configs/frozenlake.py"
    on_each train_cmd
    [[ "$(get no-follow)" == 1 ]] || logs
    ;;
  logs) logs ;;
  fetch-logs)
    run mkdir -p "$(get dest)"
    run scp ${SSH_OPTS[@]+"${SSH_OPTS[@]}"} -r "$(target "${HOSTS[0]}"):$DIR/$(get logging-dir)" "$(get dest)"
    note "then: tensorboard --logdir $(get dest)"
    ;;
  *) die "unknown action '$ACTION' (see --help)" ;;
esac
