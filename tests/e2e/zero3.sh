#!/usr/bin/env bash
# dist.zero_stage=3 (sharded parameters, gradients and AdamW state; each block gathered around
# its forward and its backward) trains as stage 0 does: 20 steps at np 2 (two micro-steps per
# rank) and np 4, minillm and a tied grouped-query llama, losses and gradient norms within 1e-6
# relative of stage 0, replicas checked every step. The blocks' parameters are held 1/np (the
# start-up memory line). Resume at stage 3 and the same world size is bitwise; chains over
# stages 3 -> 0 -> 1 -> 3 and 2 -> 3 -> 3 at world sizes 4 -> 2 -> 3 follow the stage-0 chain
# within 1e-6. Activation checkpointing combined with stage 3 gives bitwise the losses of
# stage 3 alone. Eval, samples, the replica check and checkpoints run on a stage-3 run, and
# mllm-eval / mllm-generate read its checkpoint.
source "$(dirname "$0")/common.sh"

for np in 2 4; do
  against_stage0 "$np" 3
  # Parameters and gradients: 1/np of stage 0's bytes (the start-up line).
  python3 - "$WORK/s0_minillm_np$np.log" "$WORK/s3_minillm_np$np.log" "$np" <<'PY' || fail "parameters not sharded at np $np"
import re, sys
def mib(p, what):
    return float(re.search(what + r" ([0-9.]+) MiB", open(p).read()).group(1))
np_ = int(sys.argv[3])
full_p, mine_p = mib(sys.argv[1], "parameters"), mib(sys.argv[2], "parameters")
full_g, mine_g = mib(sys.argv[1], "gradients"), mib(sys.argv[2], "gradients")
assert abs(mine_p - full_p / np_) < 0.02, f"stage 3 keeps {mine_p} MiB of {full_p} at np {np_}"
assert abs(mine_g - full_g / np_) < 0.02, f"stage 3 gradients {mine_g} MiB of {full_g}"
assert "of gathered parameters" in open(sys.argv[2]).read()
PY
  python3 - "$WORK/s3_minillm_np$np/checkpoints/step_000020/manifest.json" "$np" <<'PY' || fail "manifest at np $np"
import json, sys
sh = json.load(open(sys.argv[1]))["optimizer_shards"]
assert sh["zero_stage"] == 3 and sh["world_size"] == int(sys.argv[2]), sh
PY
done
# The saved weights are the whole model, as stage 0 saves them (close within float rounding).
python3 - "$WORK/s0_minillm_np2/checkpoints/step_000020/model.safetensors" \
  "$WORK/s3_minillm_np2/checkpoints/step_000020/model.safetensors" <<'PY' || fail "stage-3 weights"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: struct.unpack(f"<{(v['data_offsets'][1] - v['data_offsets'][0]) // 4}f",
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    d = max(abs(x - y) for x, y in zip(a[k], b[k]))
    assert d < 1e-4, f"{k}: max difference {d}"
PY
"$MLLM_BIN/mllm-eval" --checkpoint "$WORK/s3_minillm_np2" --corpus "$CORPUS" --seq-len 16 --batch 2 > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log" >&2; fail "mllm-eval on a stage-3 checkpoint"; }
"$MLLM_BIN/mllm-generate" --checkpoint "$WORK/s3_minillm_np2" --prompt "春" --max-new-tokens 8 > "$WORK/gen.log" 2>&1 || { cat "$WORK/gen.log" >&2; fail "mllm-generate on a stage-3 checkpoint"; }

# Same world size, stage 3: stop at 10, resume -> bitwise the straight run.
resume_bitwise 3

# Across stages and world sizes (chain, common.sh).
chain "$WORK/ref" 0 0 0
chain "$WORK/mixed" 3 0 1
chain "$WORK/mixed2" 2 3 3
close "$WORK/ref" "$WORK/mixed"
close "$WORK/ref" "$WORK/mixed2"

# Activation checkpointing on top of stage 3: bitwise stage 3's numbers (dropout on).
AC=(model.n_layers=3 model.activation_checkpointing=full)
run 2 "$WORK/ac_ref" model.n_layers=3 dist.zero_stage=3
run 2 "$WORK/ac_s3" "${AC[@]}" dist.zero_stage=3
same "$WORK/ac_ref" "$WORK/ac_s3"
run 2 "$WORK/ac_s3_llama" "${LLAMA[@]}" "${AC[@]}" dist.zero_stage=3
run 2 "$WORK/ac_s3_llama_ref" "${LLAMA[@]}" model.n_layers=3 dist.zero_stage=3
same "$WORK/ac_s3_llama_ref" "$WORK/ac_s3_llama"

# Refused: a stage above 3 (exit 2).
set +e; train 1 "$WORK/bad" dist.zero_stage=4 > "$WORK/bad.log" 2>&1; code=$?; set -e
[ "$code" -eq 2 ] && grep -q "zero_stage" "$WORK/bad.log" || { cat "$WORK/bad.log" >&2; fail "dist.zero_stage=4: exit $code"; }
echo PASS
