#!/usr/bin/env bash
# Issue 30, item 5: a stop signal during mllm-train's start-up (here: while the BLAS re-execution
# loads the new program image, before any recipe is read) ends the run cleanly — exit 0 after its
# first step, with a checkpoint — instead of killing it (exit 138, no run folder); and the
# re-executed process keeps the name mllm-train (ps, pgrep, pkill, Slurm accounting).
source "$(dirname "$0")/common.sh"
python3 - <<'PY' || { echo "SKIP: this CPU has neither AVX2 + FMA: no BLAS re-execution to test"; exit 0; }
import sys
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
sys.exit(0 if {"avx2", "fma"} <= set(flags) else 1)
PY
OUT="$WORK/run"
# MLLM_BLAS_TEST=generic: the start-up check believes the BLAS runs a generic path and re-executes
# the program with the correction (core/blas.h), so the window is there on every CPU with AVX2.
MLLM_BLAS_TEST=generic "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$OUT" "data.cache_dir=$CACHE" \
  "data.corpus=[$CORPUS]" train.max_steps=1000 checkpoint.every_steps=0 eval.every_steps=0 \
  > "$WORK/log" 2>&1 &
PID=$!
# The re-executed image: its environment carries MLLM_BLAS_REEXEC (set just before execv).
for _ in $(seq 1 2000); do
  tr '\0' '\n' < "/proc/$PID/environ" 2>/dev/null | grep -q '^MLLM_BLAS_REEXEC=' && break
  sleep 0.005
done
grep -q '^MLLM_BLAS_REEXEC=' <<<"$(tr '\0' '\n' < "/proc/$PID/environ")" || fail "no BLAS re-execution seen"
kill -USR1 "$PID"
name=$(cat "/proc/$PID/comm" 2>/dev/null || echo gone)
set +e; wait "$PID"; code=$?; set -e
[ "$code" -eq 0 ] || { cat "$WORK/log" >&2; fail "exit code $code after SIGUSR1 during start-up"; }
[ "$name" = "mllm-train" ] || fail "the re-executed process is named '$name', not mllm-train"
grep -q "received a stop signal" "$WORK/log" || fail "no stop message"
[ "$(cat "$OUT/checkpoints/latest")" = step_000001 ] || fail "no checkpoint of step 1"
echo "startup_signal: OK (signal during the re-execution: exit 0, checkpoint at step 1; name $name)"
