#!/usr/bin/env bash
# A process killed while writing a checkpoint leaves the previous one loadable and `latest`
# pointing at it; truncated and bit-flipped checkpoints are detected; resume: auto falls back.
source "$(dirname "$0")/common.sh"
OUT="$WORK/run"
set +e
MLLM_FAULT=kill:step=10 train 1 "$OUT" > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || fail "the fault injection did not kill the run"
[ "$(cat "$OUT/checkpoints/latest")" = step_000005 ] || fail "latest moved to a half-written save"
[ -d "$OUT/checkpoints/.tmp_step_000010" ] || fail "expected the abandoned temporary folder"
train 1 "$OUT" train.stop_at_step=12 > "$WORK/log" 2>&1 || fail "resume after the crash"
grep -q "resumed from .*step_000005 at step 5" "$WORK/log" || fail "did not resume from step 5"
# Steps 6-10 were logged before the crash and replayed after it: each must appear once.
[ "$(field "$OUT/metrics.jsonl" loss | awk '{print $1}' | uniq -d | wc -l)" -eq 0 ] \
  || fail "metrics.jsonl repeats steps after the resume"
[ "$(cat "$OUT/checkpoints/latest")" = step_000012 ] || fail "no step-12 checkpoint"

# Truncate the newest checkpoint's weights: explicit resume is an error naming the file ...
CK="$OUT/checkpoints/step_000012"
cp "$CK/model.pt" "$WORK/model.pt.bak"
truncate -s -100 "$CK/model.pt"
set +e
train 1 "$WORK/other" "checkpoint.resume=$CK" > "$WORK/log" 2>&1; code=$?
set -e
[ "$code" -eq 2 ] || fail "truncated checkpoint: exit $code, expected 2"
grep -q "model.pt is truncated" "$WORK/log" || fail "truncation not named"
# ... and resume: auto falls back to the previous good checkpoint with a warning.
train 1 "$OUT" train.stop_at_step=13 > "$WORK/log" 2>&1 || fail "auto resume with a bad latest"
grep -q "skipping checkpoint .*step_000012" "$WORK/log" || fail "no warning about the bad checkpoint"
grep -q "resumed from .*step_000010 at step 10" "$WORK/log" || fail "did not fall back to step 10"

# A flipped bit (same size) fails the checksum.
CK="$OUT/checkpoints/step_000013"
python3 - "$CK/optimizer.pt" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x10
open(p, "wb").write(bytes(b))
PY
set +e
train 1 "$WORK/other2" "checkpoint.resume=$CK" > "$WORK/log" 2>&1; code=$?
set -e
[ "$code" -eq 2 ] || fail "bit flip: exit $code, expected 2"
grep -q "optimizer.pt fails its CRC-32 check" "$WORK/log" || fail "bit flip not named"
echo PASS
