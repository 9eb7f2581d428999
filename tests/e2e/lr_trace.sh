#!/usr/bin/env bash
# The lr trace (warmup 10, cosine to step 100, lr 1e-3, min_lr 1e-4) equals the closed form,
# and is identical for 1 and 4 ranks and across resumes at steps 5 and 37; a resume with a larger
# train.max_steps is warned about and recorded with the lr it changes.
source "$(dirname "$0")/common.sh"
ARGS=(train.max_steps=100 schedule.warmup_steps=10 optim.lr=1e-3 schedule.min_lr=1e-4
      checkpoint.every_steps=0 eval.every_steps=0 model.n_layers=1 model.d_model=16)
train 1 "$WORK/np1" "${ARGS[@]}" > "$WORK/np1.log" 2>&1 || fail "np=1 run"
# Progress in the log lines and the closing summary: 100 steps x 8 sequences x 32 tokens.
grep -Eq "step +50/100 \(50%\) \| loss .* \| elapsed [0-9]+s \| eta [0-9]+s$" "$WORK/np1.log" ||
  { grep "step  *50/" "$WORK/np1.log"; fail "no progress (step 50/100 (50%), elapsed, eta) in the log line"; }
grep -q "run summary: step 100/100 (100 steps, 25600 tokens in this invocation; 25600 tokens in all) | wall time .* | final train loss .* | last checkpoint .*/checkpoints/step_000100" "$WORK/np1.log" ||
  { grep "summary" "$WORK/np1.log"; fail "no end-of-run summary"; }
train 4 "$WORK/np4" "${ARGS[@]}" >/dev/null 2>&1 || fail "np=4 run"
train 1 "$WORK/res" "${ARGS[@]}" train.stop_at_step=5 >/dev/null 2>&1 || fail "run to 5"
train 1 "$WORK/res" "${ARGS[@]}" train.stop_at_step=37 >/dev/null 2>&1 || fail "resume to 37"
train 1 "$WORK/res" "${ARGS[@]}" >/dev/null 2>&1 || fail "resume to 100"
diff <(field "$WORK/np1/metrics.jsonl" lr) <(field "$WORK/np4/metrics.jsonl" lr) || fail "np=1 vs np=4"
diff <(field "$WORK/np1/metrics.jsonl" lr) <(field "$WORK/res/metrics.jsonl" lr) || fail "straight vs resumed"
python3 - "$WORK/np1/metrics.jsonl" <<'PY' || fail "lr differs from the closed form"
import json, math, sys
lrs = {o["step"]: o["lr"] for o in map(json.loads, open(sys.argv[1])) if "loss" in o}
assert sorted(lrs) == list(range(1, 101)), sorted(lrs)[:5]
peak, lo, W, T = 1e-3, 1e-4, 10, 100
for step, got in lrs.items():
    s = step - 1  # metrics line `step` = steps completed; its lr is that of 0-based step s
    want = peak * (s + 1) / W if s < W else lo + 0.5 * (peak - lo) * (1 + math.cos(math.pi * (s - W) / (T - W)))
    assert abs(got - want) <= 1e-12 * peak, (step, got, want)
print("lr trace matches the closed form")
PY
# A longer run resumed (train.max_steps 40 -> 100): warned with the two lrs of the resumed step,
# recorded in the resume event, and the steps after it follow the 100-step curve.
train 1 "$WORK/longer" "${ARGS[@]}" train.max_steps=40 >/dev/null 2>&1 || fail "40-step run"
train 1 "$WORK/longer" "${ARGS[@]}" train.stop_at_step=42 > "$WORK/longer.log" 2>&1 || fail "resume to 42"
grep -q "resuming with train.max_steps changed: checkpoint 40 -> recipe 100" "$WORK/longer.log" ||
  fail "no warning for the changed train.max_steps"
grep -q "the lr at the resumed step 40 is 7.7500e-04, where the checkpoint's schedule (train.max_steps=40) gave 1.0000e-04" "$WORK/longer.log" ||
  { grep "lr at the resumed" "$WORK/longer.log"; fail "no warning with the two lrs"; }
python3 - "$WORK/longer/metrics.jsonl" <<'PY' || fail "resume event of the longer run"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ev = [o for o in lines if o.get("event") == "resume"]
assert len(ev) == 1 and ev[0]["step"] == 40, ev
assert ev[0]["changed"] == {"train.max_steps": {"checkpoint": "40", "recipe": "100"}}, ev
peak, lo, W = 1e-3, 1e-4, 10
cos = lambda s, T: lo + 0.5 * (peak - lo) * (1 + math.cos(math.pi * (s - W) / (T - W)))
assert abs(ev[0]["lr"]["checkpoint"] - lo) < 1e-15 and abs(ev[0]["lr"]["recipe"] - cos(40, 100)) < 1e-15, ev
for o in lines:
    if "loss" in o and o["step"] > 40:
        assert abs(o["lr"] - cos(o["step"] - 1, 100)) <= 1e-12 * peak, o
print("longer run: warned, recorded, lr", ev[0]["lr"])
PY
echo PASS
