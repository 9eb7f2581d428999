#!/usr/bin/env bash
# profile.steps at the edges (issue 56 item 6): a second invocation that records a window again
# (a rewind to an earlier checkpoint) keeps the first trace and names its own by its steps; a
# window the run cannot reach is warned about and writes nothing; at ZeRO stage 3 the trace of
# step N holds the all-gathers issued right after step N-1's update, for step N's forward.
source "$(dirname "$0")/common.sh"

# (1) steps 3-4 traced, then a rewind to step 2 traces steps 3-4 again: two files, the first kept.
train 1 "$WORK/a" train.max_steps=6 checkpoint.every_steps=2 "profile.steps=[3,4]" > "$WORK/a.log" 2>&1 ||
  { cat "$WORK/a.log"; fail "first run"; }
[ -f "$WORK/a/profile/rank_00.json" ] || fail "no trace of the first run"
cp "$WORK/a/profile/rank_00.json" "$WORK/first.json"
train 1 "$WORK/a" train.max_steps=6 "profile.steps=[3,4]" "checkpoint.resume=$WORK/a/checkpoints/step_000002" \
  > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "rewound run"; }
grep -q "resumed from .*step_000002" "$WORK/b.log" || { cat "$WORK/b.log"; fail "did not rewind to step 2"; }
cmp -s "$WORK/first.json" "$WORK/a/profile/rank_00.json" || fail "the first trace was overwritten"
grep -q "profile.steps: steps 3..4 traced into .*rank_00.steps_3-4.json" "$WORK/b.log" ||
  { grep profile "$WORK/b.log"; fail "the second trace is not named by its steps"; }
python3 - "$WORK/a/profile/rank_00.steps_3-4.json" <<'PY' || fail "the second trace"
import json, sys
names = {e["name"] for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "mllm"}
assert {"step 3", "step 4"} <= names and "step 5" not in names, sorted(names)
PY

# (2) A window past train.max_steps: a warning, no trace.
train 1 "$WORK/c" train.max_steps=4 "profile.steps=[6,7]" > "$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "run c"; }
grep -q "profile.steps=\[6, 7\] begins after train.max_steps=4: nothing will be traced" "$WORK/c.log" ||
  { cat "$WORK/c.log"; fail "no warning for an unreachable window"; }
[ ! -e "$WORK/c/profile" ] || fail "a trace of an unreachable window"
# A resume after the window: said, and nothing written.
train 1 "$WORK/a" train.max_steps=8 "profile.steps=[3,4]" > "$WORK/d.log" 2>&1 || { cat "$WORK/d.log"; fail "run d"; }
grep -q "this run resumes at step 6, after the window" "$WORK/d.log" || { cat "$WORK/d.log"; fail "no word on a passed window"; }
[ "$(ls "$WORK/a/profile" | wc -l)" -eq 2 ] || { ls "$WORK/a/profile"; fail "a resume after the window wrote a trace"; }

# (3) ZeRO stage 3, 2 ranks: step 3's trace holds the all-gathers step 2's update started.
train 2 "$WORK/z" train.max_steps=4 dist.zero_stage=3 "profile.steps=[3,3]" > "$WORK/z.log" 2>&1 ||
  { cat "$WORK/z.log"; fail "stage 3 run"; }
python3 - "$WORK/z/profile/rank_00.json" <<'PY' || fail "stage 3 trace"
import json, sys
ours = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "mllm"]
# The gathers step 2's update issued are waited for before step 3's forward: their ranges end
# before the forward begins. (A range is named when its collective is issued, so before, with
# the recording opened after them, the trace had none of these.)
forward = min((e for e in ours if e["name"] == "forward"), key=lambda e: e["ts"])
early = [e for e in ours if e["name"].endswith("all-gather") and e["ts"] + e["dur"] <= forward["ts"]]
assert early, "no all-gather done before step 3's forward: " + str(sorted({e["name"] for e in ours}))
print(f"stage 3: {len(early)} all-gather(s) for step 3's forward in its trace:", sorted({e["name"] for e in early}))
PY
echo PASS
