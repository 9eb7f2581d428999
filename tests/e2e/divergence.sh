#!/usr/bin/env bash
# Divergence and short val splits (issue 12, items 3 and 4).
source "$(dirname "$0")/common.sh"
run_expect() {  # CODE LOG NP OUT OVERRIDES...: train, expect exit CODE
  local want=$1 log=$2; shift 2
  set +e; SECONDS=0; train "$@" > "$log" 2>&1; local code=$?; set -e
  [ "$code" -eq "$want" ] || { tail -5 "$log"; fail "exit $code, expected $want ($*)"; }
  [ "$SECONDS" -le 60 ] || fail "took ${SECONDS}s, more than 60 s ($*)"
}

# An lr no float32 step can hold is a recipe error naming the key.
run_expect 2 "$WORK/lr.log" 1 "$WORK/lr" optim.lr=1e300
grep -q "optim.lr=1e300: optim.lr: must be in (0, 1e10]" "$WORK/lr.log" || fail "lr=1e300 not named"
[ ! -e "$WORK/lr" ] || fail "a bad recipe wrote the run folder"

# lr=1e6 without clipping diverges: the run stops naming the step, and no checkpoint of a
# diverged step exists (eval and save every step: a NaN val loss is never saved).
OUT="$WORK/div"
run_expect 1 "$WORK/div.log" 1 "$OUT" optim.lr=1e6 optim.grad_clip=0 checkpoint.every_steps=1 eval.every_steps=1
bad=$(grep -oE "(val loss is nan at step|gradient norm [^ ]+ at step) [0-9]+" "$WORK/div.log" | grep -oE "[0-9]+$") ||
  { tail -3 "$WORK/div.log"; fail "the divergence error names no step"; }
for d in "$OUT"/checkpoints/step_*; do
  s=$((10#${d##*step_}))
  [ "$s" -lt "$bad" ] || fail "checkpoint $d saved at or after the diverged step $bad"
done
latest=$(cat "$OUT/checkpoints/latest"); last=$((10#${latest#step_}))
[ "$last" -eq $((bad - 1)) ] || fail "latest is $latest, expected the step before $bad"
# The same when the diverged step is the last one (evaluated, then saved at the end of the run).
# With a constant lr (warmup, then no decay that depends on max_steps) a run that ends at the
# diverged step is the same run up to it: find that step, then end a run there.
run_expect 1 "$WORK/const.log" 1 "$WORK/const" optim.lr=1e6 optim.grad_clip=0 \
  checkpoint.every_steps=1 eval.every_steps=1 schedule.type=constant
bad2=$(grep -oE "(val loss is nan at step|gradient norm [^ ]+ at step) [0-9]+" "$WORK/const.log" |
  grep -oE "[0-9]+$") || { tail -3 "$WORK/const.log"; fail "the divergence error names no step"; }
run_expect 1 "$WORK/div2.log" 1 "$WORK/div2" optim.lr=1e6 optim.grad_clip=0 checkpoint.every_steps=1 \
  eval.every_steps=1 schedule.type=constant "train.max_steps=$bad2"
grep -q "at step $bad2" "$WORK/div2.log" || fail "the run ending at step $bad2 did not stop there"
[ "$(cat "$WORK/div2/checkpoints/latest")" = "$(printf 'step_%06d' $((bad2 - 1)))" ] ||
  fail "the diverged last step became latest"
# Rewind and lower the lr (and clip again): allowed, warned, recorded, and the new lr is used.
run_expect 0 "$WORK/res.log" 1 "$OUT" optim.lr=1e-3 optim.grad_clip=1.0
grep -q "resuming with optim.lr changed: checkpoint 1000000.0 -> recipe 0.001" "$WORK/res.log" || fail "lr change not warned"
python3 - "$OUT/metrics.jsonl" "$last" <<'PY' || fail "resume event / new lr"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
last = int(sys.argv[2])
ev = [o for o in lines if o.get("event") == "resume"]
assert len(ev) == 1 and ev[0]["step"] == last, ev
assert ev[0]["changed"] == {"optim.lr": {"checkpoint": "1000000.0", "recipe": "0.001"},
                            "optim.grad_clip": {"checkpoint": "0.0", "recipe": "1.0"}}, ev
# tiny.yaml: warmup 4, cosine to step 20, min_lr 1e-4; the recipe's peak is now 1e-3.
for o in lines:
    if "loss" in o and o["step"] > last:
        s = o["step"] - 1
        want = 1e-3 * (s + 1) / 4 if s < 4 else 1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * (s - 4) / 16))
        assert abs(o["lr"] - want) < 1e-15, (o["step"], o["lr"], want)
PY
# A change that is not a hyperparameter is still refused.
run_expect 2 "$WORK/res2.log" 1 "$OUT" train.max_steps=30 train.global_batch=16
grep -q "train.global_batch: checkpoint 8 -> recipe 16" "$WORK/res2.log" || fail "global_batch change not refused"

# A NaN gradient on rank 1 at step 3 (2 ranks). Default policy stop: exit 1 naming step 3,
# nothing updated, latest = step 2.
MLLM_FAULT=nan:rank=1:step=3 run_expect 1 "$WORK/stop.log" 2 "$WORK/stop" checkpoint.every_steps=1
grep -q "at step 3; nothing was updated" "$WORK/stop.log" || fail "stop: step 3 not named"
[ "$(cat "$WORK/stop/checkpoints/latest")" = step_000002 ] || fail "stop: latest is not step 2"
# Policy skip: the update of step 3 is skipped on every rank (the weights after step 3 are
# those after step 2, byte for byte), recorded in metrics.jsonl, and the run goes on.
OUT="$WORK/skip"
MLLM_FAULT=nan:rank=1:step=3 run_expect 0 "$WORK/skip.log" 2 "$OUT" train.on_nonfinite=skip checkpoint.every_steps=1 checkpoint.keep_last=30
grep -q "at step 3: update skipped on every rank" "$WORK/skip.log" || fail "skip: no warning naming step 3"
cmp -s "$OUT/checkpoints/step_000002/model.safetensors" "$OUT/checkpoints/step_000003/model.safetensors" ||
  fail "skip: the weights changed in the skipped step"
cmp -s "$OUT/checkpoints/step_000003/model.safetensors" "$OUT/checkpoints/step_000004/model.safetensors" &&
  fail "skip: the step after the skipped one did not update"
python3 - "$OUT" <<'PY' || fail "skip: metrics / state"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
skipped = [o["step"] for o in lines if o.get("skipped")]
assert skipped == [3], skipped
assert all(math.isfinite(o["loss"]) for o in lines if "loss" in o)
assert max(o["step"] for o in lines if "loss" in o) == 20
assert json.load(open(sys.argv[1] + "/checkpoints/step_000020/state.json"))["nonfinite_skips"] == 1
PY
# More skips in a row than train.max_nonfinite_skips: stop.
MLLM_FAULT=nan:rank=0:step=3,nan:rank=1:step=4 run_expect 1 "$WORK/skip2.log" 2 "$WORK/skip2" \
  train.on_nonfinite=skip train.max_nonfinite_skips=1
grep -q "at step 4: 2 updates in a row were non-finite" "$WORK/skip2.log" || fail "skip limit not named"

# A validation split shorter than one sequence is refused at the start, before any training.
python3 -c 'print("\n".join("春眠不覺曉" for _ in range(300)))' > "$WORK/short.txt"
set +e
"$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/short" "data.cache_dir=$WORK/cache-short" \
  "data.corpus=[$WORK/short.txt]" data.val_fraction=0.01 > "$WORK/short.log" 2>&1; code=$?
set -e
[ "$code" -eq 2 ] || { tail -3 "$WORK/short.log"; fail "short val split: exit $code, expected 2"; }
grep -qE "the validation split .* holds [0-9]+ tokens, fewer than one sequence needs \(data.seq_len \+ 1 = 33 tokens" "$WORK/short.log" ||
  { tail -3 "$WORK/short.log"; fail "short val split: message"; }
grep -q "step " "$WORK/short/metrics.jsonl" 2>/dev/null && fail "short val split: it trained"
echo PASS
