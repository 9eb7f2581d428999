#!/usr/bin/env bash
# dist.zero_stage=2 (sharded gradients and AdamW state) trains as stage 0 does: 20 steps at np 2
# (two micro-steps per rank: the shards accumulate) and np 4, minillm and a tied grouped-query
# llama, give the stage-0 losses and gradient norms within 1e-6 relative, parameters identical
# on every rank after every step (dist.check_every_steps=1). Gradients are held 1/np (the
# start-up memory line). Resume at stage 2 and the same world size is bitwise; a chain over
# stages 2 -> 0 -> 1 -> 2 and world sizes 4 -> 2 -> 3 follows the stage-0 chain within 1e-6.
# Activation checkpointing (model.activation_checkpointing) gives bitwise the losses of the
# plain run, dropout on, at stage 0 and combined with stage 2.
source "$(dirname "$0")/common.sh"

for np in 2 4; do
  against_stage0 "$np" 2
  # Gradients: 1/np of stage 0's bytes (the start-up line; stage 0 keeps them whole).
  python3 - "$WORK/s0_minillm_np$np.log" "$WORK/s2_minillm_np$np.log" "$np" <<'PY' || fail "gradients not sharded at np $np"
import re, sys
def grads(p):
    return float(re.search(r"gradients ([0-9.]+) MiB", open(p).read()).group(1))
full, mine, np_ = grads(sys.argv[1]), grads(sys.argv[2]), int(sys.argv[3])
assert abs(mine - full / np_) < 0.02, f"stage 2 keeps {mine} MiB of {full} at np {np_}"
PY
  python3 - "$WORK/s2_minillm_np$np/checkpoints/step_000020/manifest.json" "$np" <<'PY' || fail "manifest at np $np"
import json, sys
sh = json.load(open(sys.argv[1]))["optimizer_shards"]
assert sh["zero_stage"] == 2 and sh["world_size"] == int(sys.argv[2]), sh
PY
done

# Same world size, stage 2: stop at 10, resume -> bitwise the straight run.
resume_bitwise 2

# Across stages and world sizes (chain, common.sh).
chain "$WORK/ref" 0 0 0
chain "$WORK/mixed" 2 0 1
chain "$WORK/mixed2" 1 2 2
close "$WORK/ref" "$WORK/mixed"
close "$WORK/ref" "$WORK/mixed2"

# Activation checkpointing: the same numbers bitwise (dropout 0.1: the masks are regenerated).
AC=(model.n_layers=3 model.activation_checkpointing=full)
run 2 "$WORK/ac_ref" model.n_layers=3
run 2 "$WORK/ac_full" "${AC[@]}"
grep -q "activation checkpointing (full): 3 of 3 blocks" "$WORK/ac_full.log" || fail "no checkpointing line"
same "$WORK/ac_ref" "$WORK/ac_full"
run 2 "$WORK/ac_every" model.n_layers=3 model.activation_checkpointing=every_n model.checkpoint_every=2
grep -q "activation checkpointing (every_n): 2 of 3 blocks" "$WORK/ac_every.log" || fail "every_n line"
same "$WORK/ac_ref" "$WORK/ac_every"
run 2 "$WORK/ac_s2_ref" model.n_layers=3 model.type=llama model.multiple_of=16 dist.zero_stage=2
run 2 "$WORK/ac_s2" "${AC[@]}" model.type=llama model.multiple_of=16 dist.zero_stage=2
same "$WORK/ac_s2_ref" "$WORK/ac_s2"
# And a resume may switch it on (it changes no number).
run 2 "$WORK/ac_resume" model.n_layers=3 train.stop_at_step=10
run 2 "$WORK/ac_resume" "${AC[@]}"
same "$WORK/ac_ref" "$WORK/ac_resume"

echo PASS
