#!/usr/bin/env bash
# The val loss does not depend on the world size (issue 12, item 8): one checkpoint evaluated
# at np=1, 2 and 4 (resumed at its last step, so only the final evaluation runs) gives the same
# val loss within 1e-6 relative, over the same number of target tokens.
source "$(dirname "$0")/common.sh"
ARGS=(train.max_steps=6 eval.every_steps=0 eval.batches=5 checkpoint.every_steps=0)
train 1 "$WORK/base" "${ARGS[@]}" > "$WORK/base.log" 2>&1 || fail "training"
CK="$WORK/base/checkpoints/step_000006"
for np in 1 2 4; do
  train "$np" "$WORK/np$np" "${ARGS[@]}" "checkpoint.resume=$CK" > "$WORK/np$np.log" 2>&1 ||
    { tail "$WORK/np$np.log"; fail "eval at np=$np"; }
  grep -oE "eval step +6 \| val loss [0-9.]+ \| val ppl [0-9.]+ \| [0-9]+ tokens" "$WORK/np$np.log" | tail -1
done
python3 - "$WORK" <<'PY' || fail "val loss depends on the world size"
import json, sys
def last_val(path):
    return [json.loads(l) for l in open(path) if "val_loss" in l][-1]["val_loss"]
v = {np: last_val(f"{sys.argv[1]}/np{np}/metrics.jsonl") for np in (1, 2, 4)}
base = last_val(f"{sys.argv[1]}/base/metrics.jsonl")
print("val loss by world size:", v, "training run:", base)
for np, x in v.items():
    assert abs(x - base) <= 1e-6 * abs(base), (np, x, base)
PY
# The same tokens everywhere: eval.batches=5 x micro_batch 2 = 10 sequences of 32 targets.
for np in 1 2 4; do
  grep -qE "eval step +6 \| .* \| 320 tokens" "$WORK/np$np.log" || fail "np=$np did not evaluate 320 tokens"
done
echo PASS
