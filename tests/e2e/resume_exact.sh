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
# Changed data (issue 56): two lines of the corpus swapped in place (same size, same name), then a
# resume: refused with exit 2 naming the file, nothing written; with checkpoint.allow_data_change
# it resumes and warns. (Before: exit 0, no word, another data order.)
cp "$CORPUS" "$WORK/corpus.jsonl"
train 1 "$WORK/changed" "data.corpus=[$WORK/corpus.jsonl]" train.stop_at_step=5 > /dev/null 2>&1 ||
  fail "changed data: first half"
python3 - "$WORK/corpus.jsonl" <<'PY'
import sys
lines = open(sys.argv[1], "rb").read().split(b"\n")
first = {}  # length -> index of the first line of that length
for j, line in enumerate(lines):
    i = first.setdefault(len(line), j)
    if i != j and lines[i] != line:
        lines[i], lines[j] = lines[j], lines[i]
        break
open(sys.argv[1], "wb").write(b"\n".join(lines))
PY
size=$(stat -c %s "$WORK/corpus.jsonl")
[ "$size" -eq "$(stat -c %s "$CORPUS")" ] || fail "changed data: the swap changed the size"
set +e
train 1 "$WORK/changed" "data.corpus=[$WORK/corpus.jsonl]" > "$WORK/changed.log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/changed.log"; fail "changed data: exit $code, expected 2"; }
grep -q "the training data changed since .*step_000005 was saved" "$WORK/changed.log" &&
  grep -q "$WORK/corpus.jsonl: its contents changed" "$WORK/changed.log" &&
  grep -q "checkpoint.allow_data_change=true" "$WORK/changed.log" ||
  { cat "$WORK/changed.log"; fail "changed data: the message does not name the file and the way out"; }
[ "$(cat "$WORK/changed/checkpoints/latest")" = step_000005 ] || fail "changed data: a checkpoint was written"
train 1 "$WORK/changed" "data.corpus=[$WORK/corpus.jsonl]" checkpoint.allow_data_change=true \
  > "$WORK/changed.log" 2>&1 || { cat "$WORK/changed.log"; fail "changed data: allowed resume"; }
grep -q "resuming on changed data (checkpoint.allow_data_change=true)" "$WORK/changed.log" &&
  grep -q "resumed from" "$WORK/changed.log" || { cat "$WORK/changed.log"; fail "changed data: no warning"; }
echo "resume_exact: changed corpus refused (exit 2, file named), resumed when allowed"
echo PASS
