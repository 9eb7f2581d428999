#!/usr/bin/env bash
# SIGTERM mid-run saves a loadable checkpoint and exits 0 (and SIGUSR1 under mpirun); the run then resumes from it, and
# mllm-generate can load it. Also the time limit (train.time_limit_s).
source "$(dirname "$0")/common.sh"
OUT="$WORK/run"
# Started directly (not through train()) so that $! is mllm-train itself, not a subshell.
"$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$OUT" "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]" \
  train.max_steps=100000 checkpoint.every_steps=0 eval.every_steps=0 > "$WORK/log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do  # wait (at most 60 s) until a few steps are done
  [ -f "$OUT/metrics.jsonl" ] && [ "$(wc -l < "$OUT/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -TERM "$PID"
set +e; wait "$PID"; code=$?; set -e
[ "$code" -eq 0 ] || { cat "$WORK/log" >&2; fail "exit code $code after SIGTERM"; }
grep -q "received a stop signal" "$WORK/log" || fail "no stop message"
latest=$(cat "$OUT/checkpoints/latest")
step=$((10#${latest#step_}))
[ "$step" -ge 3 ] || fail "checkpoint at step $step"
train 1 "$OUT" train.max_steps=100000 "train.stop_at_step=$((step + 2))" > "$WORK/log2" 2>&1 \
  || fail "resume after SIGTERM"
grep -q "resumed from .*$latest at step $step" "$WORK/log2" || fail "did not resume from $latest"
"$MLLM_BIN/mllm-generate" --checkpoint "$OUT" --prompt "春" --max-new-tokens 5 --seed 1 \
  > "$WORK/gen" 2>"$WORK/gen.err" || { cat "$WORK/gen.err" >&2; fail "mllm-generate"; }
grep -q "^春" "$WORK/gen" || fail "generated text does not start with the prompt"
# The `latest` file itself names the checkpoint too; bad options are refused before any output.
"$MLLM_BIN/mllm-generate" --checkpoint "$OUT/checkpoints/latest" --prompt "春" --max-new-tokens 5 \
  --seed 1 > "$WORK/gen2" 2>"$WORK/gen.err" || { cat "$WORK/gen.err" >&2; fail "mllm-generate on latest"; }
cmp -s "$WORK/gen" "$WORK/gen2" || fail "checkpoints/latest gave other text than the run folder"
set +e
"$MLLM_BIN/mllm-generate" --checkpoint "$OUT" --prompt "春" --top-p 0 > "$WORK/gen3" 2>"$WORK/gen.err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "--top-p 0: exit $code, expected 2"
[ ! -s "$WORK/gen3" ] || fail "--top-p 0 printed before refusing: $(cat "$WORK/gen3")"
grep -q "top_p must be in (0, 1]" "$WORK/gen.err" || { cat "$WORK/gen.err"; fail "--top-p 0 message"; }

# Under mpirun: SIGUSR1 to mpirun reaches every rank (mpirun forwards it); all ranks stop after
# the same step, save, and the job exits 0.
mpirun -np 2 --bind-to none "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/mpi" \
  "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]" train.max_steps=100000 \
  checkpoint.every_steps=0 eval.every_steps=0 > "$WORK/log4" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
  [ -f "$WORK/mpi/metrics.jsonl" ] && [ "$(wc -l < "$WORK/mpi/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -USR1 "$PID"
set +e; wait "$PID"; code=$?; set -e
[ "$code" -eq 0 ] || { cat "$WORK/log4" >&2; fail "mpirun exit code $code after SIGUSR1"; }
[ -f "$WORK/mpi/checkpoints/latest" ] || fail "no checkpoint after SIGUSR1 under mpirun"

# train.time_limit_s ends the invocation early with a checkpoint and exit 0; the schedule is
# unchanged (lr of the last step taken equals the closed form for max_steps=100000).
train 1 "$WORK/limit" train.max_steps=100000 train.time_limit_s=2 checkpoint.every_steps=0 \
  eval.every_steps=0 > "$WORK/log3" 2>&1 || fail "time-limited run did not exit 0"
grep -q "reached train.time_limit_s" "$WORK/log3" || fail "no time-limit stop message"
[ -f "$WORK/limit/checkpoints/latest" ] || fail "no checkpoint after the time limit"
echo PASS
