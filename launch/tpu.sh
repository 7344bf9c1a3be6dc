#!/usr/bin/env bash
# Cloud TPU VM (or pod slice) for rollx: create, set up, Ray, train, logs, delete.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

USAGE="Usage: launch/tpu.sh ACTION --project=P --zone=Z --name=N [options] [-- rollx.train args]

Actions (in the order of a run):
  create      create the TPU VM, or with --queued a queued resource (waits until ACTIVE)
  setup       copy this checkout (or clone --git-repo) to every worker, install rollx there
  ray-start   Ray head on worker 0, Ray workers on the others (env workers, servers)
  train       python -m rollx.train on every worker (one JAX process per host), detached;
              then follow worker 0's log (Ctrl-C stops following, not training)
  logs        follow worker --worker's training log
  fetch-logs  copy worker 0's TensorBoard logs to --dest (then: tensorboard --logdir DEST)
  ray-stop    stop Ray on every worker
  delete      delete the TPU VM / queued resource (and everything on it)
  up          create + setup + ray-start + train

Example:
  launch/tpu.sh up --project=my-proj --zone=us-west4-a --name=rollx-v5e \\
      --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite --spot \\
      -- --config=configs/frozenlake.py --config.max_steps=50"

opt project "" "GCP project (required)"
opt zone "" "zone with TPU quota, e.g. us-west4-a (required)"
opt name "" "TPU VM / queued resource name (required)"
opt accelerator-type "" "create: e.g. v5litepod-16, v4-32 (required for create)"
opt runtime-version "" "create: TPU software version, e.g. v2-alpha-tpuv5-lite, tpu-ubuntu2204-base (required for create)"
flag spot "create: spot capacity (cheaper, preemptible)"
flag reserved "create: use the project's reservation"
flag queued "create/delete: a queued resource instead of a plain TPU VM (waits for capacity)"
opt wait-s 3600 "create --queued: give up after this many seconds"
opt dir rollx "checkout on each worker, relative to the home directory"
opt git-repo "" "setup: clone this repository instead of copying this checkout"
opt git-ref main "setup: branch, tag or commit of --git-repo"
opt python python3.11 "setup: python used to create DIR/.venv (apt-installed when missing)"
opt jax-extra "jax[tpu]" "setup: the JAX build for the accelerator"
opt head-resources '{"rollx_head": 1}' "ray-start: custom resources of worker 0's Ray node (JSON)"
opt worker-resources '{"rollx_worker": 1}' "ray-start: custom resources of the other Ray nodes (JSON)"
opt log output/train.log "train: training output, relative to DIR on each worker"
flag no-follow "train: do not follow worker 0's log"
opt worker 0 "logs: which worker's log"
opt logging-dir output/logs "fetch-logs: the run's logging_dir, relative to DIR"
opt dest ./tpu-logs "fetch-logs: local destination"
parse_args "$@"
[[ ${#POSITIONAL[@]} == 1 ]] || die "expected one ACTION (see --help), got: ${POSITIONAL[*]-nothing}"
ACTION=${POSITIONAL[0]}
require project zone name
NAME=$(get name)
DIR=$(get dir)
WHERE=(--project="$(get project)" --zone="$(get zone)")

# ssh WORKER COMMAND: COMMAND on one worker, a list (1,3), or all of them, at once.
tpu_ssh() {
  run gcloud compute tpus tpu-vm ssh "$NAME" "${WHERE[@]}" --worker="$1" --command="$2"
}

create() {
  require accelerator-type runtime-version
  local capacity=()
  [[ "$(get spot)" == 1 && "$(get reserved)" == 1 ]] && die "--spot and --reserved exclude each other"
  [[ "$(get spot)" == 1 ]] && capacity=(--spot)
  [[ "$(get reserved)" == 1 ]] && capacity=(--reserved)
  if [[ "$(get queued)" == 0 ]]; then
    run gcloud compute tpus tpu-vm create "$NAME" "${WHERE[@]}" \
      --accelerator-type="$(get accelerator-type)" --version="$(get runtime-version)" \
      ${capacity[@]+"${capacity[@]}"}
    return
  fi
  run gcloud compute tpus queued-resources create "$NAME" "${WHERE[@]}" --node-id="$NAME" \
    --accelerator-type="$(get accelerator-type)" --runtime-version="$(get runtime-version)" \
    ${capacity[@]+"${capacity[@]}"}
  local state="" waited=0 describe=(gcloud compute tpus queued-resources describe "$NAME"
    "${WHERE[@]}" --format=value\(state.state\))
  note "every 30 s until the state is ACTIVE (at most $(get wait-s) s):"
  if [[ "$DRY_RUN" == 1 ]]; then
    quote "${describe[@]}"
    return
  fi
  while [[ "$state" != ACTIVE ]]; do
    state=$("${describe[@]}")
    case "$state" in
      FAILED | SUSPENDED) die "queued resource $NAME is $state" ;;
    esac
    ((waited < $(get wait-s))) || die "queued resource $NAME not ACTIVE after $waited s ($state)"
    [[ "$state" == ACTIVE ]] || { sleep 30; waited=$((waited + 30)); }
  done
}

setup() {
  local py fetch install tarball=${TMPDIR:-/tmp}/rollx-src-$NAME.tgz
  py=$(get python)
  ensure_ray_token
  if [[ -n "$(get git-repo)" ]]; then
    fetch="(test -d $DIR/.git || git clone -q $(quote "$(get git-repo)") $DIR) && cd $DIR && git fetch -q origin $(quote "$(get git-ref)") && git checkout -q --detach FETCH_HEAD"
  else
    # The working tree as it is (uncommitted edits included), without build outputs.
    run tar -czf "$tarball" -C "$ROLLX_ROOT" --exclude=./.venv --exclude=./output \
      --exclude=.git --exclude=__pycache__ --exclude='*.egg-info' .
    fetch="mkdir -p $DIR && tar -xzf rollx-src.tgz -C $DIR && cd $DIR"
  fi
  run gcloud compute tpus tpu-vm scp "$RAY_TOKEN_FILE" "$NAME:rollx-ray-token" "${WHERE[@]}" --worker=all
  [[ -n "$(get git-repo)" ]] ||
    run gcloud compute tpus tpu-vm scp "$tarball" "$NAME:rollx-src.tgz" "${WHERE[@]}" --worker=all
  install="(command -v $py >/dev/null || (sudo apt-get update -qq && sudo apt-get install -y -qq $py $py-venv)) && $fetch && $py -m venv .venv && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e . $(quote "$(get jax-extra)") tensorboard"
  tpu_ssh all "set -e; $INSTALL_RAY_TOKEN && $install"
}

node() {  # node WORKER ACTION ARG...: launch/node.sh there, located from TPU metadata
  local worker=$1 action=$2
  shift 2
  tpu_ssh "$worker" "cd $DIR && bash launch/node.sh $(quote "$action" --tpu "$@")"
}

ray_start() {
  # The head first: workers that start before it would give up joining.
  node 0 ray-start --only=head --head-resources="$(get head-resources)"
  node all ray-start --only=workers --worker-resources="$(get worker-resources)"
}

train() {
  [[ ${#EXTRA[@]} -gt 0 ]] || die "missing rollx.train arguments after --, e.g. -- --config=configs/frozenlake.py"
  node all train --detach --log="$(get log)" -- "${EXTRA[@]}"
  [[ "$(get no-follow)" == 1 ]] || logs
}

logs() {
  tpu_ssh "$(get worker)" "tail -n +1 -F $DIR/$(get log)"
}

fetch_logs() {
  run mkdir -p "$(get dest)"
  run gcloud compute tpus tpu-vm scp --recurse "$NAME:$DIR/$(get logging-dir)" "$(get dest)" \
    "${WHERE[@]}" --worker=0
  note "then: tensorboard --logdir $(get dest)"
}

delete() {
  if [[ "$(get queued)" == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$NAME" "${WHERE[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${WHERE[@]}" --quiet
  fi
}

case "$ACTION" in
  create) create ;;
  setup) setup ;;
  ray-start) ray_start ;;
  train) train ;;
  logs) logs ;;
  fetch-logs) fetch_logs ;;
  ray-stop) node all ray-stop ;;
  delete) delete ;;
  up)
    [[ ${#EXTRA[@]} -gt 0 ]] || die "missing rollx.train arguments after --, e.g. -- --config=configs/frozenlake.py"
    create
    setup
    ray_start
    train
    ;;
  *) die "unknown action '$ACTION' (see --help)" ;;
esac
