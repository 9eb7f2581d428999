#!/usr/bin/env bash
# Sweeps a recipe over a grid of overrides: one training run per point in its own folder,
# resumable, then a results table (markdown + CSV) and gnuplot PNGs. All options: --help.
#   launch/sweep.sh RECIPE GRID... [--np N] [--parallel SLOTS] [--threads T] [--eval-points K]
#                   [--out DIR] [--dry-run]
# Option parsing (one table for the parser and --help), grid expansion, the plan and result
# collection live in launch/sweep_lib.py; this script runs the trainers and gnuplot.
set -euo pipefail
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$LAUNCH_DIR")"
PYTHON=${PYTHON:-python3}
GNUPLOT=${GNUPLOT:-gnuplot}
# The source tree's build/bin; in an install (<prefix>/share/mllm/launch) the prefix's bin/.
if [ -z "${MLLM_BIN:-}" ]; then
  MLLM_BIN=$ROOT/build/bin
  [ -x "$MLLM_BIN/mllm-train" ] || [ ! -x "$ROOT/../../bin/mllm-train" ] ||
    MLLM_BIN=$(cd "$ROOT/../../bin" && pwd)
fi
export MLLM_BIN
LIB="$LAUNCH_DIR/sweep_lib.py"

say() { echo "sweep: $*" >&2; }
quoted() { local out; printf -v out '%q ' "$@"; echo "${out% }"; }

# Parse, validate every point (mllm-train --print-recipe) and write the plan; exit 2 on bad input.
PLAN=$("$PYTHON" "$LIB" plan "$@") || exit $?
eval "$PLAN"
if [ "${SWEEP_HELP:-0}" = 1 ]; then exec "$PYTHON" "$LIB" usage; fi

# point_cmd I: ARGS = recipe + overrides of point I (as recorded in the plan) + run.out_dir and
# threads; CMD = its training command.
point_cmd() {
  local i=$1
  local -n ov="SWEEP_OVERRIDES_$i"
  ARGS=("$SWEEP_RECIPE" "${ov[@]}" "run.out_dir=$SWEEP_OUT/${SWEEP_POINTS[$i]}")
  [ "$SWEEP_USER_THREADS" = 1 ] || ARGS+=("train.threads=$SWEEP_THREADS")
  CMD=("$MLLM_BIN/mllm-train" "${ARGS[@]}")
  if [ "$SWEEP_NP" -gt 1 ]; then CMD=("$LAUNCH_DIR/mpirun.sh" -np "$SWEEP_NP" "${CMD[@]}"); fi
  return 0
}

# stop_session SID: SIGTERM to the trainers of one point, the mllm-train processes of the session
# it was started in (they checkpoint and exit 0). Signalled directly, not through mpirun, which
# would SIGKILL its ranks a few seconds later.
stop_session() {
  local pids
  pids=$(pgrep -s "$1" -x mllm-train 2>/dev/null || true)
  # shellcheck disable=SC2086
  if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true
  else kill -TERM "$1" 2>/dev/null || true; fi
}

# run_point I (in a background subshell): trains point I, appends the output to its sweep.log
# and "start end exit-code" to its invocations.tsv (the wall time in the table).
run_point() {
  local i=$1 dir="$SWEEP_OUT/${SWEEP_POINTS[$1]}" start end rc tpid="" signalled=0
  trap '' INT   # a terminal's Ctrl-C reaches the whole group; this script stops points itself
  trap 'signalled=1; [ -z "$tpid" ] || stop_session "$tpid"' TERM
  point_cmd "$i"
  # Stopped before the trainer started: leave the point as it is.
  if [ "$signalled" = 1 ]; then echo 0 > "$dir/.exit_code"; exit 0; fi
  start=$(date +%s.%N)
  echo "+ $(quoted "${CMD[@]}")" >> "$dir/sweep.log"
  # Own session: Ctrl-C does not reach mpirun (it would kill its ranks); stop_session finds them.
  OMP_NUM_THREADS=$SWEEP_THREADS setsid "${CMD[@]}" >> "$dir/sweep.log" 2>&1 < /dev/null &
  tpid=$!
  while :; do
    rc=0; wait "$tpid" || rc=$?
    # A trapped SIGTERM cuts wait short (rc > 128); wait again for the trainer's own status.
    if [ "$rc" -gt 128 ] && [ "$signalled" = 1 ]; then signalled=0; continue; fi
    break
  done
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$start" "$end" "$rc" >> "$dir/invocations.tsv"
  echo "$rc" > "$dir/.exit_code"
  exit "$rc"
}

# Data: with several points at once, prepare each point's data cache first, one at a time, so
# that no two trainers write the same cache (mllm-prepare skips an up-to-date cache).
todo=()
for i in "${!SWEEP_POINTS[@]}"; do
  if [ "${SWEEP_STATES[$i]}" = "done" ]; then
    say "skip ${SWEEP_POINTS[$i]} (done)"
  else
    todo+=("$i")
  fi
done
if [ "$SWEEP_PARALLEL" -gt 1 ]; then
  for i in "${todo[@]}"; do
    point_cmd "$i"
    prep=("$MLLM_BIN/mllm-prepare" "${ARGS[@]}")
    if [ "$SWEEP_DRY_RUN" = 1 ]; then quoted "${prep[@]}"; continue; fi
    "${prep[@]}" >> "$SWEEP_OUT/${SWEEP_POINTS[$i]}/sweep.log" 2>&1 || {
      rc=$?; say "data preparation for ${SWEEP_POINTS[$i]} failed (exit $rc); see its sweep.log"; exit "$rc"; }
  done
fi
if [ "$SWEEP_DRY_RUN" = 1 ]; then
  for i in "${todo[@]}"; do point_cmd "$i"; quoted "${CMD[@]}"; done
  exit 0
fi

declare -A RUNNING=()   # subshell pid -> point index
STOP=0 FAILED=0
on_signal() {
  [ "$STOP" = 1 ] && return
  STOP=1
  say "stopping: running points save a checkpoint; run the same command again to resume"
  for pid in "${!RUNNING[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap on_signal INT TERM

# reap_one: waits until a point ends (or a signal arrives) and reports the points that ended.
# Exit codes come from the points' .exit_code files: wait's own status is unreliable when a
# trapped signal interrupts it.
reap_one() {
  local pid rc i dir
  wait -n "${!RUNNING[@]}" 2>/dev/null || true
  for pid in "${!RUNNING[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    i=${RUNNING[$pid]}
    dir="$SWEEP_OUT/${SWEEP_POINTS[$i]}"
    unset "RUNNING[$pid]"
    rc=$(cat "$dir/.exit_code" 2>/dev/null || echo "unknown")
    if [ "$rc" = 0 ]; then
      say "${SWEEP_POINTS[$i]}: exit 0"
    else
      FAILED=$((FAILED + 1))
      say "${SWEEP_POINTS[$i]}: FAILED (exit $rc); see $dir/sweep.log"
    fi
  done
}

n=0
for i in "${todo[@]}"; do
  while [ "${#RUNNING[@]}" -ge "$SWEEP_PARALLEL" ]; do reap_one; done
  [ "$STOP" = 1 ] && break
  n=$((n + 1))
  verb=train; [ "${SWEEP_STATES[$i]}" = resume ] && verb="resume"
  say "[$n/${#todo[@]}] ${SWEEP_POINTS[$i]}: $verb (log: $SWEEP_OUT/${SWEEP_POINTS[$i]}/sweep.log)"
  rm -f "$SWEEP_OUT/${SWEEP_POINTS[$i]}/.exit_code"
  run_point "$i" &
  RUNNING[$!]=$i
done
while [ "${#RUNNING[@]}" -gt 0 ]; do reap_one; done
trap - INT TERM

# Results: table + plots, also after an interruption (finished points are in it).
collected=0
"$PYTHON" "$LIB" collect "$SWEEP_OUT" || collected=$?
[ "$collected" -eq 0 ] || [ "$collected" -eq 3 ] || exit "$collected"
if command -v "$GNUPLOT" >/dev/null; then
  (cd "$SWEEP_OUT" && "$GNUPLOT" plots.gp) || say "gnuplot failed; the table is still there"
  # The per-run charts of launch/plot-run.sh, every point on one chart, in SWEEP_OUT/plots/.
  points=()
  for p in "${SWEEP_POINTS[@]}"; do [ -s "$SWEEP_OUT/$p/metrics.jsonl" ] && points+=("$SWEEP_OUT/$p"); done
  if [ "${#points[@]}" -gt 0 ]; then
    "$PYTHON" "$(dirname "$0")/run_plots.py" --gnuplot "$GNUPLOT" --out "$SWEEP_OUT/plots" "${points[@]}" \
      > /dev/null || say "plots of the runs failed; the table is still there"
  fi
else
  say "no gnuplot ($GNUPLOT): skipped the PNGs (launch/install-deps.sh installs gnuplot-nox)"
fi
say "results: $SWEEP_OUT/results.md, results.csv, val_loss.png, final_val_loss.png, plots/ (loss, lr, throughput)"
if [ "$STOP" = 1 ]; then exit 130; fi
[ "$FAILED" -eq 0 ] || exit 1
if [ "$collected" -eq 3 ]; then
  say "some points are not finished (see the status column); run the same command again to continue"
  exit 1
fi
