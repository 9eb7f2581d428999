#!/usr/bin/env bash
# Bad input exits 2 with one clear message and writes nothing; a changed model shape on resume
# is refused with the difference printed.
source "$(dirname "$0")/common.sh"
set +e
"$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/bad" optim.learnng_rate=3e-4 > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || fail "typo: exit $code, expected 2"
grep -q "did you mean optim.lr?" "$WORK/log" || fail "no suggestion"
[ "$(grep -c "error" "$WORK/log")" -eq 1 ] || { cat "$WORK/log"; fail "expected exactly one error line"; }
[ ! -e "$WORK/bad" ] || fail "a bad recipe wrote the run folder"

# Under mpirun: every rank fails the same way, one message, exit 2, nothing written.
set +e
mpirun -np 2 --bind-to none "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/bad2" \
  train.global_batch=6 train.micro_batch=2 > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/log"; fail "world-size rule: exit $code, expected 2"; }
grep -q "multiple of 4" "$WORK/log" || { cat "$WORK/log"; fail "global batch message"; }
[ ! -e "$WORK/bad2" ] || fail "a bad recipe wrote the run folder"

# train.device=cuda where no GPU is visible (CI, or CUDA_VISIBLE_DEVICES="" anywhere): exit 2,
# naming what is missing, nothing written. With a CUDA LibTorch the message is about the GPU.
set +e
CUDA_VISIBLE_DEVICES="" "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/cuda" train.device=cuda \
  > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/log"; fail "train.device=cuda without a GPU: exit $code, expected 2"; }
grep -q -E "no GPU is visible on this machine|LibTorch has no CUDA" "$WORK/log" ||
  { cat "$WORK/log"; fail "train.device=cuda message"; }
[ ! -e "$WORK/cuda" ] || fail "train.device=cuda without a GPU wrote the run folder"

# Resume with another model shape is refused with the difference.
train 1 "$WORK/run" train.stop_at_step=5 > /dev/null 2>&1 || fail "first run"
set +e
train 1 "$WORK/run" model.d_model=64 > "$WORK/log" 2>&1; code=$?
set -e
[ "$code" -eq 2 ] || fail "shape change: exit $code, expected 2"
grep -q "model.d_model: checkpoint 32 -> recipe 64" "$WORK/log" || { cat "$WORK/log"; fail "difference not printed"; }
echo PASS
