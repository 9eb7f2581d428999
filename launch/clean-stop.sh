#!/usr/bin/env bash
# Runs COMMAND (an mpirun line) so that Ctrl-C and SIGTERM stop an mllm job cleanly:
#   launch/clean-stop.sh COMMAND [ARGS...]
# The first Ctrl-C (SIGINT) or SIGTERM becomes SIGUSR1 to COMMAND, which mpirun forwards to every
# rank: mllm-train saves a checkpoint at the end of the step and the job exits 0. A second one is
# passed on as it came (mpirun then kills the ranks: exit 1); SIGHUP is passed on at once.
# Why: OpenMPI's mpirun treats its own SIGINT/SIGTERM as an abort. It signals the ranks with
# SIGTERM, kills them one second later (odls_base_sigkill_timeout), often before the save is
# done, and exits 1 either way. COMMAND runs in its own process group, so a terminal's Ctrl-C
# reaches this script only. launch/mpirun.sh and the `mpirun` of launch/env.sh run through it.
# Exit code: COMMAND's; 2 without one.
set -uo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") echo "clean-stop.sh: no COMMAND given (usage: launch/clean-stop.sh COMMAND [ARGS...])" >&2; exit 2 ;;
esac
pid="" pending="" stops=0
# shellcheck disable=SC2317  # called from the traps
forward() {  # forward SIGNAL: the first INT/TERM as USR1, later ones and HUP as they came
  [ -n "$pid" ] || { pending=$1; return; }  # arrived before COMMAND started: sent once it has
  stops=$((stops + 1))
  if [ "$1" != HUP ] && [ "$stops" -eq 1 ]; then
    echo "clean-stop: SIG$1: asking every rank for a checkpointed stop (SIGUSR1 to mpirun); once more to abort" >&2
    kill -USR1 "$pid" 2> /dev/null
  else
    kill "-$1" "$pid" 2> /dev/null
  fi
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP
set -m  # job control: the background COMMAND gets a process group of its own
"$@" &
pid=$!
set +m
[ -z "$pending" ] || forward "$pending"
# wait returns early (status > 128) whenever a trapped signal arrives: wait again until COMMAND
# has ended; bash keeps an ended child's status for the next wait.
while :; do
  wait "$pid"; rc=$?
  [ "$rc" -gt 128 ] && kill -0 "$pid" 2> /dev/null && continue
  break
done
if [ "$rc" -gt 128 ]; then wait "$pid" 2> /dev/null; r2=$?; [ "$r2" -ne 127 ] && rc=$r2; fi
exit "$rc"
