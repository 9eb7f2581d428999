#!/usr/bin/env bash
# Fault injection (MLLM_FAULT, docs/reliability.md) under 2 ranks: a rank that throws, a rank
# that hangs, replicas that drift apart. Each job ends within 60 s, names the rank and step,
# and the checkpoint saved before the fault still resumes. (NaN gradients: divergence.sh;
# full disk: disk_full.sh; kill during a save: checkpoint_faults.sh.)
source "$(dirname "$0")/common.sh"
ARGS=(train.max_steps=20 checkpoint.every_steps=2 eval.every_steps=0)
run_fault() {  # NAME FAULT OVERRIDES...: expect a non-zero exit within 60 s
  local name=$1 fault=$2; shift 2
  set +e; SECONDS=0
  MLLM_FAULT="$fault" train 2 "$WORK/$name" "${ARGS[@]}" "$@" > "$WORK/$name.log" 2>&1; local code=$?
  set -e
  [ "$code" -ne 0 ] || fail "$name: the job exited 0"
  [ "$SECONDS" -le 60 ] || fail "$name: took ${SECONDS}s to end"
  echo "$name: exit $code after ${SECONDS}s"
}
resumes() {  # NAME STEP: the checkpoint of STEP is latest and resumes
  [ "$(cat "$WORK/$1/checkpoints/latest")" = "$(printf 'step_%06d' "$2")" ] || fail "$1: latest is not step $2"
  train 2 "$WORK/$1" "${ARGS[@]}" train.stop_at_step=$(($2 + 1)) > "$WORK/$1.resume.log" 2>&1 || fail "$1: resume"
  grep -q "resumed from .* at step $2 " "$WORK/$1.resume.log" || fail "$1: did not resume from step $2"
}

run_fault throw throw:rank=1:step=5
grep -q "rank 1: step 5: injected failure" "$WORK/throw.log" || fail "throw: rank and step not named"
resumes throw 4

# Rank 1 hangs in step 5; rank 0 waits in the gradient all-reduce until dist.timeout_s.
run_fault hang sleep:rank=1:step=5:seconds=300 dist.timeout_s=5
grep -qE "rank 0: step 5: .* did not finish within dist.timeout_s = 5 s" "$WORK/hang.log" ||
  { grep -i error "$WORK/hang.log"; fail "hang: the timeout does not name rank and step"; }
resumes hang 4
pgrep -f "mllm_e2e.*/hang " >/dev/null && fail "hang: a rank is still running"

# Rank 1's weights drift after step 3; the replica check every 3 steps stops the run there.
run_fault desync desync:rank=1:step=3 dist.check_every_steps=3
grep -qE "replica check at step 3: rank 1 differs from rank 0 in parameter [^ ]+ \(and 0 more of [0-9]+ tensors\)" "$WORK/desync.log" ||
  { grep -i error "$WORK/desync.log"; fail "desync: not named"; }
# Without a fault the replicas are bitwise identical after every step.
train 2 "$WORK/clean" "${ARGS[@]}" dist.check_every_steps=1 > "$WORK/clean.log" 2>&1 || { tail "$WORK/clean.log"; fail "replica check on a clean run"; }

# A malformed MLLM_FAULT is an error, not ignored.
set +e; MLLM_FAULT=explode:step=1 train 1 "$WORK/bad" "${ARGS[@]}" > "$WORK/bad.log" 2>&1; code=$?; set -e
[ "$code" -eq 2 ] && grep -q "MLLM_FAULT: 'explode:step=1': unknown kind" "$WORK/bad.log" || fail "bad MLLM_FAULT: exit $code"
echo PASS
