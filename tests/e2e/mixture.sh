#!/usr/bin/env bash
# data.sources: two sources drawn 3 : 1. The draws per source in metrics.jsonl match the weights
# within sampling error; the small source runs out and wraps (logged, an event in metrics.jsonl);
# a stop and resume at the same world size is bitwise exact, one at another world size draws the
# same global batches; data.corpus and data.sources together are refused (exit 2).
source "$(dirname "$0")/common.sh"

head -n 20 "$CORPUS" > "$WORK/small.jsonl"
tail -n 300 "$CORPUS" > "$WORK/big.jsonl"
SOURCES="data.sources=[{name: small, corpus: [$WORK/small.jsonl], weight: 3}, {name: big, corpus: [$WORK/big.jsonl], weight: 1}]"
mix() {  # mix NP OUT [overrides...]
  local np=$1 out=$2; shift 2
  local cmd=("$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$out" "data.cache_dir=$CACHE"
             "data.corpus=[]" "$SOURCES" train.max_steps=40 checkpoint.every_steps=10 "$@")
  if [ "$np" -eq 1 ]; then "${cmd[@]}"; else mpirun -np "$np" --bind-to none "${cmd[@]}"; fi
}

mix 2 "$WORK/straight" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "mixture run"; }
grep -q "data source 0 'small'" "$WORK/log" || { cat "$WORK/log"; fail "no per-source line"; }
grep -q "data source 'small' ran out at step" "$WORK/log" || fail "the small source never wrapped"
python3 - "$WORK/straight/metrics.jsonl" <<'PY' || fail "draws per source"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
last = [o for o in lines if "source_tokens" in o][-1]
seq, slots = 32, 40 * 8
small, big = last["source_tokens"]["small"] / seq, last["source_tokens"]["big"] / seq
assert small + big == slots, (small, big)
p = 0.75
sigma = math.sqrt(slots * p * (1 - p))
assert abs(small - slots * p) < 4 * sigma, f"small drawn {small} times of {slots}, expected {slots*p} +- {4*sigma:.1f}"
events = [o for o in lines if o.get("event") == "source_epoch"]
assert events and all(o["source"] == "small" for o in events), events
print(f"mixture: small {small:.0f} / big {big:.0f} of {slots} draws (expected {slots*p:.0f} +- {sigma:.1f}); {len(events)} epoch event(s)")
PY

# Stop at step 20 and resume: bitwise the same run.
mix 2 "$WORK/split" train.stop_at_step=20 > /dev/null 2>&1 || fail "first half"
mix 2 "$WORK/split" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "resume"; }
grep -q "resumed from" "$WORK/log" || fail "did not resume"
cmp "$WORK/straight/checkpoints/step_000040/model.safetensors" \
    "$WORK/split/checkpoints/step_000040/model.safetensors" || fail "parameters differ after resume"
diff <(grep source_tokens "$WORK/straight/metrics.jsonl" | python3 -c 'import json,sys; [print(json.loads(l)["step"], json.loads(l)["source_tokens"]) for l in sys.stdin]') \
     <(grep source_tokens "$WORK/split/metrics.jsonl" | python3 -c 'import json,sys; [print(json.loads(l)["step"], json.loads(l)["source_tokens"]) for l in sys.stdin]') ||
  fail "draws per source differ after resume"

# At another world size (dropout 0): the same global batches.
mix 2 "$WORK/w2" model.dropout=0.0 > /dev/null 2>&1 || fail "2-rank straight"
mix 2 "$WORK/w21" model.dropout=0.0 train.stop_at_step=20 > /dev/null 2>&1 || fail "2-rank half"
mix 1 "$WORK/w21" model.dropout=0.0 > /dev/null 2>&1 || fail "1-rank resume"
python3 - "$WORK/w2/metrics.jsonl" "$WORK/w21/metrics.jsonl" <<'PY' || fail "other batches after a world-size change"
import json, sys
def rows(p):
    return {o["step"]: o for o in map(json.loads, open(p)) if "loss" in o}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
for s in range(21, 41):
    assert a[s]["source_tokens"] == b[s]["source_tokens"], s
    assert abs(a[s]["loss"] - b[s]["loss"]) < 1e-4 * abs(a[s]["loss"]), (s, a[s]["loss"], b[s]["loss"])
print("mixture: 2 ranks -> 1 rank resumes with the same draws and losses")
PY

# A source's file changed (a line appended, the same name) since the checkpoint: the resume is
# refused (exit 2) naming the file and its data.sources entry (before the tokenizer check, which
# the new characters would fail too without saying why).
echo '{"text": "新的一首詩"}' >> "$WORK/big.jsonl"
set +e
mix 1 "$WORK/w21" model.dropout=0.0 train.max_steps=50 > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/log"; fail "changed source: exit $code"; }
grep -q "$WORK/big.jsonl (data.sources\[1\] 'big'): its contents changed" "$WORK/log" ||
  { cat "$WORK/log"; fail "changed source: the message does not name it"; }

set +e
"$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/bad" "$SOURCES" > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/log"; fail "corpus and sources: exit $code"; }
grep -q "data.corpus is set too" "$WORK/log" || { cat "$WORK/log"; fail "corpus and sources: message"; }
echo PASS
