#!/usr/bin/env bash
# A full disk (issue 12, item 2). Run folder on a 4 MiB tmpfs, checkpoints of about 2.8 MiB:
# the second save fails. Wanted: exit 1 (no SIGABRT) naming the file and "No space left on
# device", no temporary folder left, `latest` and the first checkpoint intact and resumable,
# and a relaunch on the still-full disk keeps every metrics.jsonl line it had.
# Then the same failure injected (MLLM_FAULT enospc) under mpirun -np 2 for other files.
source "$(dirname "$0")/common.sh"
FULL="$WORK/full"
mkdir -p "$FULL"
if ! mount -t tmpfs -o size=4m tmpfs "$FULL" 2>/dev/null; then
  echo "SKIP tmpfs part: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)"
  TMPFS=0
else
  TMPFS=1
  trap 'umount -l "$FULL" 2>/dev/null || true; cleanup' EXIT
fi
ARGS=(train.max_steps=20 checkpoint.every_steps=5 checkpoint.keep_last=3 eval.every_steps=0)
expect_enospc() {  # LOG FILE-PATTERN
  grep -qE "cannot write .*$2: No space left on device" "$1" || { tail -5 "$1"; fail "no named ENOSPC error for $2"; }
  if grep -qE "terminate called|Aborted|core dumped" "$1"; then fail "died by std::terminate"; fi
}
if [ "$TMPFS" = 1 ]; then
  OUT="$FULL/run"
  set +e; train 1 "$OUT" "${ARGS[@]}" > "$WORK/a.log" 2>&1; code=$?; set -e
  [ "$code" -eq 1 ] || { tail "$WORK/a.log"; fail "full disk: exit $code, expected 1"; }
  expect_enospc "$WORK/a.log" "step_000010/(model|optimizer)\.pt"
  [ "$(cat "$OUT/checkpoints/latest")" = step_000005 ] || fail "latest moved"
  [ -z "$(ls -A "$OUT/checkpoints" | grep -v '^latest$\|^step_000005$')" ] ||
    fail "left behind: $(ls -A "$OUT/checkpoints")"
  head -n 5 "$OUT/metrics.jsonl" > "$WORK/first5"
  [ "$(wc -l < "$WORK/first5")" -eq 5 ] || fail "metrics.jsonl lost lines"
  # Relaunch on the still-full disk: resumes from step 5, fails at the same save, and the lines
  # of steps 1-5 are still there, unchanged.
  set +e; train 1 "$OUT" "${ARGS[@]}" > "$WORK/b.log" 2>&1; code=$?; set -e
  [ "$code" -eq 1 ] || fail "relaunch: exit $code, expected 1"
  grep -q "resumed from .*step_000005 at step 5" "$WORK/b.log" || fail "relaunch did not resume"
  cmp -s "$WORK/first5" <(head -n 5 "$OUT/metrics.jsonl") || fail "the relaunch changed metrics lines 1-5"
  [ "$(cat "$OUT/checkpoints/latest")" = step_000005 ] || fail "latest moved on relaunch"
  # Completely full now: the relaunch must rewrite metrics.jsonl (it holds steps 6-9 past the
  # checkpoint) and cannot; the error names the file and every line is still there.
  cp "$OUT/metrics.jsonl" "$WORK/metrics.before"
  dd if=/dev/zero of="$FULL/filler" bs=4k 2>/dev/null || true
  set +e; train 1 "$OUT" "${ARGS[@]}" > "$WORK/c.log" 2>&1; code=$?; set -e
  [ "$code" -eq 1 ] || { tail -3 "$WORK/c.log"; fail "full relaunch: exit $code, expected 1"; }
  grep -q "cannot rewrite $OUT/metrics.jsonl .*No space left on device; the file is unchanged" "$WORK/c.log" ||
    { tail -3 "$WORK/c.log"; fail "full relaunch: the failed rewrite is not named"; }
  cmp -s "$WORK/metrics.before" "$OUT/metrics.jsonl" || fail "full relaunch changed metrics.jsonl"
  [ ! -e "$OUT/metrics.jsonl.tmp" ] || fail "full relaunch left metrics.jsonl.tmp"
  # Space again (the run folder copied to a normal disk): it resumes from step 5 and finishes.
  cp -a "$OUT" "$WORK/moved"
  umount "$FULL"
  train 1 "$WORK/moved" "${ARGS[@]}" > "$WORK/ok.log" 2>&1 || { tail "$WORK/ok.log"; fail "resume on a normal disk"; }
  grep -q "resumed from .*step_000005 at step 5" "$WORK/ok.log" || fail "did not resume from step 5 on a normal disk"
  [ "$(cat "$WORK/moved/checkpoints/latest")" = step_000020 ] || fail "the moved run did not finish"
  echo "tmpfs part passed"
fi

# Injected: the 2-rank job fails at step 10's save of optimizer.pt, then of rank 1's RNG file.
for file in optimizer.pt rng_rank_01.pt manifest.json; do
  OUT="$WORK/inj_${file%%.*}"
  set +e; MLLM_FAULT="enospc:step=10:file=$file" train 2 "$OUT" "${ARGS[@]}" > "$WORK/i.log" 2>&1; code=$?; set -e
  [ "$code" -eq 1 ] || { tail "$WORK/i.log"; fail "$file: exit $code, expected 1"; }
  expect_enospc "$WORK/i.log" "step_000010/$file"
  [ "$(cat "$OUT/checkpoints/latest")" = step_000005 ] || fail "$file: latest moved"
  train 2 "$OUT" "${ARGS[@]}" > "$WORK/j.log" 2>&1 || { tail "$WORK/j.log"; fail "$file: resume"; }
  grep -q "resumed from .*step_000005 at step 5" "$WORK/j.log" || fail "$file: did not resume from step 5"
  [ -z "$(ls -A "$OUT/checkpoints" | grep '^\.')" ] || fail "$file: temporary files left: $(ls -A "$OUT/checkpoints")"
done
echo PASS
