#!/usr/bin/env bash
# dist.zero_stage=1 (sharded AdamW state) trains as stage 0 does: at np 2 and 4, 20 steps give
# the stage-0 losses and gradient norms within 1e-6 relative, with the parameters identical on
# every rank after every step (dist.check_every_steps=1: a CRC of every parameter compared
# across ranks). Each rank writes its own optimizer shard and the manifest lists the ranges.
# Resumes: at the same world size bitwise; 4 -> 2 ranks, stage 1 -> 0 and 0 -> 1 continue the
# trajectory of the same resume at stage 0 (1e-6). Dropout 0 where the world size changes
# (dropout streams are per rank).
source "$(dirname "$0")/common.sh"
CHECK=(dist.check_every_steps=1)

for np in 2 4; do
  train "$np" "$WORK/s0_np$np" dist.zero_stage=0 "${CHECK[@]}" > "$WORK/s0_np$np.log" 2>&1 || fail "stage 0, np $np"
  train "$np" "$WORK/s1_np$np" dist.zero_stage=1 "${CHECK[@]}" > "$WORK/s1_np$np.log" 2>&1 ||
    { tail -n 20 "$WORK/s1_np$np.log" >&2; fail "stage 1, np $np"; }
  close "$WORK/s0_np$np" "$WORK/s1_np$np"
  grep -q "replica check" "$WORK/s1_np$np.log" && fail "replica check failed at stage 1, np $np"
  # Optimizer state: about 1/np of stage 0's on each rank (the log says how much).
  python3 - "$WORK/s0_np$np.log" "$WORK/s1_np$np.log" "$np" <<'PY' || fail "optimizer state not sharded at np $np"
import re, sys
def elements(p):
    m = re.search(r"AdamW moments of (\d+) of (\d+) elements", open(p).read())
    return int(m.group(1)), int(m.group(2))
(full, total), (mine, total1) = elements(sys.argv[1]), elements(sys.argv[2])
np_ = int(sys.argv[3])
assert full == total == total1, (full, total, total1)
assert abs(mine - total / np_) <= np_, f"rank 0 keeps {mine} of {total} at np {np_}"
PY
  ckpt="$WORK/s1_np$np/checkpoints/step_000020"
  [ ! -e "$ckpt/optimizer.pt" ] || fail "stage 1 wrote optimizer.pt"
  python3 - "$ckpt" "$np" <<'PY' || fail "optimizer shards at np $np"
import json, os, sys
folder, np_ = sys.argv[1], int(sys.argv[2])
m = json.load(open(os.path.join(folder, "manifest.json")))
sh = m["optimizer_shards"]
assert sh["zero_stage"] == 1 and sh["world_size"] == np_ and len(sh["ranks"]) == np_
covered = {}
for r, rank in enumerate(sh["ranks"]):
    assert rank["file"] == f"optimizer_rank_{r:02d}.pt" and rank["file"] in m["files"]
    for p in rank["pieces"]:
        covered.setdefault(p["param"], []).append((p["begin"], p["end"], p["numel"]))
for name, pieces in covered.items():   # every element of every parameter exactly once
    pieces.sort()
    assert pieces[0][0] == 0 and pieces[-1][1] == pieces[0][2], (name, pieces)
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), (name, pieces)
PY
done

# Same world size, stage 1: stop at 10, resume -> bitwise the straight stage-1 run.
train 2 "$WORK/s1_split" dist.zero_stage=1 train.stop_at_step=10 > /dev/null 2>&1 || fail "stage 1 first half"
train 2 "$WORK/s1_split" dist.zero_stage=1 > "$WORK/s1_resume.log" 2>&1 || fail "stage 1 resume"
grep -q "resumed from" "$WORK/s1_resume.log" || fail "stage 1 did not resume"
diff <(field "$WORK/s1_np2/metrics.jsonl" loss) <(field "$WORK/s1_split/metrics.jsonl" loss) ||
  fail "stage 1 resume is not exact"
cmp "$WORK/s1_np2/checkpoints/step_000020/model.safetensors" \
    "$WORK/s1_split/checkpoints/step_000020/model.safetensors" || fail "stage 1 resume: weights differ"

# Re-sharding, dropout 0: the same resume at stage 0 is the reference.
D=(model.dropout=0.0)
train 4 "$WORK/ref42" "${D[@]}" train.stop_at_step=10 > /dev/null 2>&1 || fail "reference np 4"
train 2 "$WORK/ref42" "${D[@]}" > /dev/null 2>&1 || fail "reference np 4 -> 2"
train 4 "$WORK/z42" "${D[@]}" dist.zero_stage=1 train.stop_at_step=10 > /dev/null 2>&1 || fail "stage 1 np 4"
train 2 "$WORK/z42" "${D[@]}" dist.zero_stage=1 "${CHECK[@]}" > "$WORK/z42.log" 2>&1 ||
  { tail -n 20 "$WORK/z42.log" >&2; fail "stage 1 np 4 -> np 2"; }
close "$WORK/ref42" "$WORK/z42"
train 2 "$WORK/ref0" "${D[@]}" > /dev/null 2>&1 || fail "reference np 2"
train 2 "$WORK/z10" "${D[@]}" dist.zero_stage=1 train.stop_at_step=10 > /dev/null 2>&1 || fail "stage 1 half"
train 2 "$WORK/z10" "${D[@]}" dist.zero_stage=0 > "$WORK/z10.log" 2>&1 || { tail -n 20 "$WORK/z10.log" >&2; fail "stage 1 -> 0"; }
close "$WORK/ref0" "$WORK/z10"
train 2 "$WORK/z01" "${D[@]}" dist.zero_stage=0 train.stop_at_step=10 > /dev/null 2>&1 || fail "stage 0 half"
train 4 "$WORK/z01" "${D[@]}" dist.zero_stage=1 train.stop_at_step=15 > /dev/null 2>&1 || fail "stage 0 -> 1 at np 4"
train 2 "$WORK/z01" "${D[@]}" dist.zero_stage=1 > /dev/null 2>&1 || fail "stage 1 np 4 -> 2"
# Reference for the last chain: stage 0 with the same world sizes at the same steps.
train 2 "$WORK/ref01" "${D[@]}" train.stop_at_step=10 > /dev/null 2>&1 || fail "reference 0"
train 4 "$WORK/ref01" "${D[@]}" train.stop_at_step=15 > /dev/null 2>&1 || fail "reference 1"
train 2 "$WORK/ref01" "${D[@]}" > /dev/null 2>&1 || fail "reference 2"
close "$WORK/ref01" "$WORK/z01"

echo PASS
