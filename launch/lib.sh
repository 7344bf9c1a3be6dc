# shellcheck shell=bash
# Shared by the launch/*.sh scripts (sourced, never run): option parsing, --help,
# --dry-run and the `run` wrapper. Plain bash 3.2 features only (no associative
# arrays), so the scripts also run from macOS's /bin/bash.

PROG=$(basename "$0")
# shellcheck disable=SC2034  # ROLLX_ROOT, EXTRA: read by the scripts that source this
ROLLX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY_RUN=0
POSITIONAL=()  # arguments that are not options (a subcommand)
EXTRA=()       # everything after `--`, passed through untouched
export ROLLX_ROOT
_OPT_NAMES=()
_OPT_LINES=()
_FLAG_NAMES=()

die() {
  echo "$PROG: $*" >&2
  exit 2
}

_var() { local n=${1//-/_}; echo "OPT_${n}"; }

# opt NAME DEFAULT HELP: a --NAME=VALUE (or --NAME VALUE) option; read it with `get NAME`.
opt() {
  _OPT_NAMES+=("$1")
  printf -v "$(_var "$1")" '%s' "$2"
  _OPT_LINES+=("$(printf '  --%-22s %s%s' "$1=..." "$3" "${2:+ (default: $2)}")")
}

# flag NAME HELP: a boolean --NAME; `get NAME` is 1 when given, else 0.
flag() {
  _FLAG_NAMES+=("$1")
  printf -v "$(_var "$1")" '%s' 0
  _OPT_LINES+=("$(printf '  --%-22s %s' "$1" "$2")")
}

get() {
  local v
  v=$(_var "$1")
  printf '%s' "${!v}"
}

_is_in() {
  local needle=$1 x
  shift
  for x in "$@"; do [[ "$x" == "$needle" ]] && return 0; done
  return 1
}

usage() {
  echo "$USAGE"
  echo
  echo "Options:"
  printf '%s\n' "${_OPT_LINES[@]}"
  printf '  --%-22s %s\n' "dry-run" "print the exact commands instead of running them"
  printf '  --%-22s %s\n' "help" "this text"
}

parse_args() {
  local arg name value
  while [[ $# -gt 0 ]]; do
    arg=$1
    shift
    case "$arg" in
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --)
        # shellcheck disable=SC2034
        EXTRA=("$@")
        break
        ;;
      --*)
        name=${arg#--}
        name=${name%%=*}
        if _is_in "$name" ${_FLAG_NAMES[@]+"${_FLAG_NAMES[@]}"}; then
          [[ "$arg" == *=* ]] && die "--$name takes no value (see --help)"
          printf -v "$(_var "$name")" '%s' 1
        elif _is_in "$name" ${_OPT_NAMES[@]+"${_OPT_NAMES[@]}"}; then
          if [[ "$arg" == *=* ]]; then
            value=${arg#*=}
          else
            [[ $# -gt 0 ]] || die "--$name needs a value (see --help)"
            value=$1
            shift
          fi
          printf -v "$(_var "$name")" '%s' "$value"
        else
          die "unknown option $arg (see --help)"
        fi
        ;;
      *) POSITIONAL+=("$arg") ;;
    esac
  done
}

# require NAME...: each option must be non-empty.
require() {
  local name
  for name in "$@"; do
    [[ -n "$(get "$name")" ]] || die "missing required argument --$name (see --help)"
  done
}

# quote ARG...: one line that a shell reads back as exactly these arguments.
quote() {
  local out="" a
  for a in "$@"; do
    if [[ -n "$a" && "$a" =~ ^[A-Za-z0-9_@%+=:,./~-]+$ && "$a" != "~"* ]]; then
      out+="$a "
    else
      out+="'${a//\'/\'\\\'\'}' "
    fi
  done
  printf '%s\n' "${out% }"
}

# run CMD ARG...: runs it, or under --dry-run prints it (one line, quoted).
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    quote "$@"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

# note TEXT: what a dry run would otherwise not show (a wait loop, a file written).
note() {
  if [[ "$DRY_RUN" == 1 ]]; then echo "# $*"; else echo "$PROG: $*" >&2; fi
}

# run_parallel: runs each queued command (see `queue`) at once, waits for all, and
# fails if any failed. Under --dry-run prints them in order.
_QUEUE=()
queue() { _QUEUE+=("$(quote "$@")"); }
run_parallel() {
  local cmd pids=() failed=0 pid
  for cmd in ${_QUEUE[@]+"${_QUEUE[@]}"}; do
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "$cmd"
    else
      echo "+ $cmd &" >&2
      bash -c "$cmd" &
      pids+=($!)
    fi
  done
  _QUEUE=()
  for pid in ${pids[@]+"${pids[@]}"}; do
    wait "$pid" || failed=$((failed + 1))
  done
  [[ $failed == 0 ]] || die "$failed of ${#pids[@]} parallel commands failed"
}

# json_resources NAME...: '{"NAME": 1, ...}' for `ray start --resources`.
json_resources() {
  local out="" n
  for n in "$@"; do
    [[ -n "$n" ]] && out+="\"$n\": 1, "
  done
  printf '{%s}' "${out%, }"
}

# Ray clusters started by `ray start` require a shared token (Ray >= 2.5x, RAY_AUTH_MODE=
# token): one is made here once and copied to every host by the setup actions.
RAY_TOKEN_FILE=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
ensure_ray_token() {
  [[ -s "$RAY_TOKEN_FILE" ]] && return 0
  note "generating a Ray auth token in $RAY_TOKEN_FILE"
  [[ "$DRY_RUN" == 1 ]] && return 0
  mkdir -p "$(dirname "$RAY_TOKEN_FILE")"
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$RAY_TOKEN_FILE")
}
# shellcheck disable=SC2034  # used by tpu.sh, gpu.sh
# Remote shell that moves the copied token (in the home directory) into place.
INSTALL_RAY_TOKEN="mkdir -p ~/.ray && mv -f rollx-ray-token ~/.ray/auth_token && chmod 600 ~/.ray/auth_token"
