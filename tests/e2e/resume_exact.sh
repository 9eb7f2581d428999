#!/usr/bin/env bash
# Resume is exact: 2 ranks, 20 steps straight vs stop_at_step=10 then resume to 20 -> bitwise
# equal parameters and equal (loss, lr) metrics for steps 11-20. And a 4-rank checkpoint resumed
# at 2 ranks continues with the same global batches (dropout 0: losses agree to rounding).
source "$(dirname "$0")/common.sh"

train 2 "$WORK/straight" >/dev/null 2>&1 || fail "straight run"
train 2 "$WORK/split" train.stop_at_step=10 >/dev/null 2>&1 || fail "first half"
[ "$(cat "$WORK/split/checkpoints/latest")" = step_000010 ] || fail "no step-10 checkpoint"
train 2 "$WORK/split" > "$WORK/resume.log" 2>&1 || fail "resume"
grep -q "resumed from" "$WORK/resume.log" || fail "second invocation did not resume"
cmp "$WORK/straight/checkpoints/step_000020/model.safetensors" \
    "$WORK/split/checkpoints/step_000020/model.safetensors" || fail "parameters differ after resume"
for key in loss lr; do
  diff <(field "$WORK/straight/metrics.jsonl" $key | awk '$1 > 10') \
       <(field "$WORK/split/metrics.jsonl" $key | awk '$1 > 10') || fail "$key differs after resume"
done
[ "$(field "$WORK/split/metrics.jsonl" loss | wc -l)" -eq 20 ] || fail "expected 20 metrics lines"

# World size change: 4 ranks to step 10, then 2 ranks; compare with 4 ranks straight.
train 4 "$WORK/w4" model.dropout=0.0 >/dev/null 2>&1 || fail "4-rank straight"
train 4 "$WORK/w42" model.dropout=0.0 train.stop_at_step=10 >/dev/null 2>&1 || fail "4-rank half"
train 2 "$WORK/w42" model.dropout=0.0 >/dev/null 2>&1 || fail "2-rank resume of a 4-rank checkpoint"
python3 - "$WORK/w4/metrics.jsonl" "$WORK/w42/metrics.jsonl" <<'PY' || fail "different global batches after world-size change"
import json, sys
def losses(p):
    return {o["step"]: o["loss"] for o in map(json.loads, open(p)) if "loss" in o}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
for s in range(11, 21):
    rel = abs(a[s] - b[s]) / abs(a[s])
    assert rel < 1e-4, f"step {s}: {a[s]} vs {b[s]} (rel {rel:.2e})"
print("world-size change: steps 11-20 agree")
PY
echo PASS
