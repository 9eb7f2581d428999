#!/usr/bin/env bash
# Runs mpirun for this machine and prints the command first:
#   launch/mpirun.sh -np N PROGRAM [ARGS...]
# Adds --oversubscribe only when N exceeds the cores, the allow-run-as-root variables only when
# run as root, and OMP_NUM_THREADS = cores / N (at least 1) unless already set.
# Settings from the environment: MPIRUN (default mpirun), MPIRUN_EXTRA (more mpirun flags).
set -euo pipefail
usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] && { usage; exit 0; }
[ "${1:-}" = "-np" ] && [ -n "${2:-}" ] || { usage >&2; exit 2; }
NP=$2; shift 2
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { echo "mpirun.sh: -np must be a positive integer, got '$NP'" >&2; exit 2; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
CORES=$(nproc)
FLAGS=(-np "$NP" --bind-to none)
[ "$NP" -gt "$CORES" ] && FLAGS+=(--oversubscribe)
ENVS=()
if [ "$(id -u)" -eq 0 ]; then
  ENVS+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
fi
THREADS=$(( CORES / NP )); [ "$THREADS" -ge 1 ] || THREADS=1
ENVS+=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}")
# shellcheck disable=SC2206
EXTRA=(${MPIRUN_EXTRA:-})
CMD=(env "${ENVS[@]}" "${MPIRUN:-mpirun}" "${FLAGS[@]}" "${EXTRA[@]}" "$@")
echo "+ ${CMD[*]}" >&2
exec "${CMD[@]}"
