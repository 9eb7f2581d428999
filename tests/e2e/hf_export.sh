#!/usr/bin/env bash
# mllm-export: a grouped-query llama checkpoint (untied, and tied) as a Hugging Face folder whose
# weights, read by an independent transformers-layout Llama (tests/assets/model/
# hf_llama_reference.py), give mllm's logits within 1e-5 (fp32); the files and config values a
# loader needs; bf16 export; minillm refused with a pointer to its own safetensors.
# init_std 0.1 makes attention matter to the logits (scale ~3): exporting q/k without the rotary
# permutation then misses by ~0.7, far above the 1e-5 the correct export meets (~1e-6).
source "$(dirname "$0")/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest: the Python holding the torch we link}"
REF="$MLLM_SOURCE_DIR/tests/assets/model/hf_llama_reference.py"
for tie in false true; do
  run="$WORK/llama-$tie"
  train 2 "$run" model.type=llama model.n_heads=4 model.n_kv_heads=2 model.d_ff=0 model.multiple_of=16 \
    model.tie_embeddings=$tie model.init_std=0.1 train.max_steps=3 eval.every_steps=0 \
    data.cache_dir="$WORK/cache-llama" \
    > "$run.log" 2>&1 || { tail "$run.log"; fail "training llama (tie $tie)"; }
  "$MLLM_BIN/mllm-export" --checkpoint "$run" --out "$WORK/hf-$tie" > "$WORK/export.out" 2>&1 ||
    { cat "$WORK/export.out"; fail "mllm-export (tie $tie)"; }
  for f in config.json model.safetensors generation_config.json tokenizer.json tokenizer_config.json; do
    [ -s "$WORK/hf-$tie/$f" ] || fail "export (tie $tie) lacks $f"
  done
  python3 - "$WORK/hf-$tie" "$tie" <<'PY' || fail "config.json (tie $tie)"
import json, struct, sys
folder, tie = sys.argv[1], sys.argv[2] == "true"
c = json.load(open(f"{folder}/config.json"))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "tie_word_embeddings": tie, "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0,
        "torch_dtype": "float32", "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0}
for k, v in want.items():
    assert c[k] == v, (k, c[k], v)
# SwiGLU hidden of d_model 32, multiple_of 16: 2/3 * 4 * 32 = 85 -> rounded up to 96.
assert c["intermediate_size"] == 96, c["intermediate_size"]
with open(f"{folder}/model.safetensors", "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    names = set(json.loads(f.read(n))) - {"__metadata__"}
assert ("lm_head.weight" in names) != tie, sorted(names)
assert "model.layers.0.self_attn.k_proj.weight" in names and "model.norm.weight" in names
tok = json.load(open(f"{folder}/tokenizer.json"))
assert tok["model"]["type"] == "WordLevel" and tok["model"]["vocab"]["<BOS>"] == 2
assert len(tok["model"]["vocab"]) == c["vocab_size"], (len(tok["model"]["vocab"]), c["vocab_size"])
print("config ok (tie", tie, ")")
PY
  "$MLLM_TORCH_PYTHON" "$REF" compare "$WORK/hf-$tie" "$run" --atol 1e-5 || fail "logits differ (tie $tie)"
done
"$MLLM_BIN/mllm-export" --checkpoint "$WORK/llama-false" --out "$WORK/hf-bf16" --dtype bf16 > /dev/null 2>&1 ||
  fail "bf16 export"
grep -q '"torch_dtype": "bfloat16"' "$WORK/hf-bf16/config.json" || fail "bf16 config"
"$MLLM_TORCH_PYTHON" "$REF" compare "$WORK/hf-bf16" "$WORK/llama-false" --atol 0.1 || fail "bf16 logits"
train 1 "$WORK/mini" train.max_steps=1 eval.every_steps=0 > "$WORK/mini.log" 2>&1 || fail "training minillm"
set +e
"$MLLM_BIN/mllm-export" --checkpoint "$WORK/mini" --out "$WORK/hf-mini" > "$WORK/out" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/out"; fail "minillm export: exit $code, expected 2"; }
grep -q "no standard Hugging Face architecture.*model.safetensors" "$WORK/out" || { cat "$WORK/out"; fail "minillm message"; }
[ ! -e "$WORK/hf-mini" ] || fail "a refused export wrote its folder"
echo PASS
