#!/usr/bin/env bash
# One writer per run folder (issue 12, item 1): while run A trains, run B on the same
# run.out_dir (1 rank, then 2 ranks) exits 2 naming the folder and A's pid, and A's files are
# untouched; once A is gone (here SIGKILLed, so nothing released the lock but the kernel) the
# folder is free again and B resumes from A's checkpoint.
source "$(dirname "$0")/common.sh"
OUT="$WORK/run"
# Started directly (not through `train`, a shell function): $A is the trainer itself, so the
# trap below can always end it, also when it is stopped (SIGSTOP) and the test fails.
"$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$OUT" "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]" \
  train.max_steps=100000 checkpoint.every_steps=5 > "$WORK/a.log" 2>&1 &
A=$!
trap 'kill -CONT $A 2>/dev/null || true; kill -KILL $A 2>/dev/null || true; cleanup' EXIT
for _ in $(seq 300); do [ -e "$OUT/checkpoints/latest" ] && break; sleep 0.1; done
[ -e "$OUT/checkpoints/latest" ] || fail "run A wrote no checkpoint"
holder=$(awk '{print $2}' "$OUT/.lock")
[ "$holder" = "$A" ] || fail ".lock does not name run A's process $A: $(cat "$OUT/.lock")"
kill -STOP "$holder"  # frozen: its files must not change while B tries
snapshot() { (cd "$OUT" && find . -type f ! -name '*.lock' -exec md5sum {} + | sort); }
before=$(snapshot)
for np in 1 2; do
  set +e
  train "$np" "$OUT" train.max_steps=10 > "$WORK/b$np.log" 2>&1; code=$?
  set -e
  [ "$code" -eq 2 ] || { cat "$WORK/b$np.log"; fail "np=$np: second writer exited $code, expected 2"; }
  grep -q "run folder $OUT is in use by another run (pid $holder on host $(hostname))" "$WORK/b$np.log" ||
    { cat "$WORK/b$np.log"; fail "np=$np: the refusal does not name the folder and holder"; }
done
[ "$before" = "$(snapshot)" ] || fail "the second writer changed run A's files"
kill -KILL "$A"; wait $A 2>/dev/null || true
step=$(sed 's/step_0*//' "$OUT/checkpoints/latest")
train 1 "$OUT" "train.max_steps=$((step + 2))" > "$WORK/c.log" 2>&1 || { tail "$WORK/c.log"; fail "after A died"; }
grep -q "resumed from .*step_0*$step at step $step" "$WORK/c.log" || fail "did not resume from A's checkpoint"
echo PASS
