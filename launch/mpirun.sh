#!/usr/bin/env bash
# Runs mpirun for this machine (one node) and prints the command first, on stderr:
#   launch/mpirun.sh -np N [--threads T] [--dry-run] PROGRAM [ARGS...]
# N ranks on this node with T threads each (OMP_NUM_THREADS; default cores / N, at least 1);
# --oversubscribe only when N exceeds the cores; the allow-run-as-root variables only as root.
# Ctrl-C or SIGTERM stops every rank with a checkpoint and exits 0, a second one aborts
# (launch/clean-stop.sh). For several nodes use launch/slurm.sbatch (docs/multinode.md).
set -euo pipefail

# The option table drives the parser and --help: "flags|VALUE|help" (VALUE empty = a switch).
OPTIONS=(
  "-np|N|ranks on this node (required)"
  "--threads|T|threads per rank: sets OMP_NUM_THREADS and, for mllm-train, appends train.threads=T (default: OMP_NUM_THREADS if set, else cores / N, at least 1; mllm-train's train.threads: auto gives the same)"
  "--dry-run||print the command and exit 0 without running it"
  "-h,--help||this help"
)
ENVIRONMENT=(
  "MPIRUN|mpirun program (default mpirun)"
  "MPIRUN_EXTRA|more mpirun flags, split on spaces (e.g. '--mca btl self,vader')"
  "MLLM_CORES|cores to plan for (default: nproc)"
  "MLLM_DRY_RUN|1 = --dry-run"
)

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  echo "Options:"
  local row flags value help
  for row in "${OPTIONS[@]}"; do
    IFS='|' read -r flags value help <<< "$row"
    printf '%s\n' "$help" | fold -s -w 76 | sed 's/ *$//' | {
      read -r line; printf '  %-16s %s\n' "${flags//,/, }${value:+ $value}" "$line"
      while read -r line; do printf '%19s%s\n' '' "$line"; done
    }
  done
  echo "Environment:"
  for row in "${ENVIRONMENT[@]}"; do
    IFS='|' read -r flags help <<< "$row"
    printf '  %-16s %s\n' "$flags" "$help"
  done
  echo "Exit code: mpirun's; 2 for a bad command line."
}
die() { echo "mpirun.sh: $*" >&2; echo "usage: launch/mpirun.sh -np N [--threads T] [--dry-run] PROGRAM [ARGS...] (--help)" >&2; exit 2; }

# Parse with the table: a flag's value (if any) follows it; the first non-option is PROGRAM.
declare -A VALUE_OF=() TAKES=()
for row in "${OPTIONS[@]}"; do
  IFS='|' read -r flags value _ <<< "$row"
  IFS=',' read -ra names <<< "$flags"
  for name in "${names[@]}"; do TAKES[$name]=$value; done
done
while [ $# -gt 0 ]; do
  case "$1" in -*) ;; *) break ;; esac
  [ -n "${TAKES[$1]+x}" ] || die "unknown option '$1'"
  flag=$1; shift
  if [ -n "${TAKES[$flag]}" ]; then
    [ $# -gt 0 ] || die "$flag needs a value ${TAKES[$flag]}"
    VALUE_OF[$flag]=$1; shift
  else
    VALUE_OF[$flag]=1
  fi
done
if [ -n "${VALUE_OF[-h]:-}${VALUE_OF[--help]:-}" ]; then usage; exit 0; fi
NP=${VALUE_OF[-np]:-}
[ -n "$NP" ] || die "-np N is required"
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || die "-np must be a positive integer, got '$NP'"
[ $# -ge 1 ] || die "no PROGRAM given"
CORES=${MLLM_CORES:-$(nproc)}
[[ "$CORES" =~ ^[1-9][0-9]*$ ]] || die "MLLM_CORES must be a positive integer, got '$CORES'"
THREADS=${VALUE_OF[--threads]:-}
if [ -n "$THREADS" ]; then
  [[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$THREADS'"
else
  THREADS=${OMP_NUM_THREADS:-$(( CORES / NP > 0 ? CORES / NP : 1 ))}
fi
DRY_RUN=${VALUE_OF[--dry-run]:-${MLLM_DRY_RUN:-0}}

FLAGS=(-np "$NP" --bind-to none)
[ "$NP" -gt "$CORES" ] && FLAGS+=(--oversubscribe)
ENVS=()
if [ "$(id -u)" -eq 0 ]; then
  ENVS+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
fi
ENVS+=(OMP_NUM_THREADS="$THREADS")
PROGRAM_ARGS=("$@")
if [ -n "${VALUE_OF[--threads]:-}" ] && [[ "$(basename "$1")" == mllm-train* ]]; then
  PROGRAM_ARGS+=("train.threads=$THREADS")
fi
# shellcheck disable=SC2206
EXTRA=(${MPIRUN_EXTRA:-})
CMD=(env "${ENVS[@]}" "${MPIRUN:-mpirun}" "${FLAGS[@]}" "${EXTRA[@]}" "${PROGRAM_ARGS[@]}")
printf -v SHOWN '%q ' "${CMD[@]}"
echo "+ ${SHOWN% }" >&2
[ "$DRY_RUN" = 1 ] && exit 0
# Ctrl-C / SIGTERM: SIGUSR1 to mpirun, a checkpointed stop of every rank, exit 0 (clean-stop.sh).
exec "$(dirname "$0")/clean-stop.sh" "${CMD[@]}"
