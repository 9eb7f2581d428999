#!/usr/bin/env bash
# Parity with PyTorch through the files a user gets: train minillm and a grouped-query llama on
# 2 ranks, then bench/torch_reference.py (plain PyTorch models, its own safetensors and shard
# readers) computes the validation loss of the final checkpoint's weights; it must equal the
# val loss mllm logged for that step within 1e-5 (fp32, CPU).
source "$(dirname "$0")/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest: the Python holding the torch we link}"
check() {  # NAME OVERRIDES...
  local name=$1; shift
  train 2 "$WORK/$name" train.max_steps=8 eval.every_steps=0 eval.batches=3 "$@" > "$WORK/$name.log" 2>&1 ||
    { tail -20 "$WORK/$name.log"; fail "$name: training"; }
  local ours theirs
  ours=$(grep '"val_loss"' "$WORK/$name/metrics.jsonl" | tail -1 |
         python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["val_loss"]))')
  theirs=$("$MLLM_TORCH_PYTHON" "$MLLM_SOURCE_DIR/bench/torch_reference.py" val-loss \
             "$WORK/$name" 2>/dev/null |
           python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read().splitlines()[-1])["val_loss"]))') ||
    fail "$name: torch_reference.py"
  python3 - "$ours" "$theirs" "$name" <<'PY' || fail "$name: val loss differs from PyTorch"
import sys
ours, theirs = float(sys.argv[1]), float(sys.argv[2])
print(f"{sys.argv[3]}: mllm {ours!r}, PyTorch {theirs!r}, |diff| {abs(ours - theirs):.2e}")
sys.exit(abs(ours - theirs) > 1e-5)
PY
}
check minillm
check llama model.type=llama model.n_heads=4 model.n_kv_heads=2 model.d_ff=0 model.multiple_of=16 \
  data.cache_dir="$WORK/cache-llama"
echo PASS
