#!/usr/bin/env bash
# The GPU throughput benchmark of recipes/gpt2-small.yaml's shape (GPT-2 124M's: d 768, 12 layers,
# seq 1024, vocabulary 50,257, bf16, SDPA) in one call: launch/gpu-check.sh's build, its
# sync_debug check (the host synchronisations of a step; the first GPU run crashed there), then
# its bench check: mllm eager, mllm with CUDA graphs (skipped until train.cuda_graphs exists),
# PyTorch eager and PyTorch torch.compile, each with tokens/s, MFU against the measured bf16 GEMM
# peak, peak memory, kernels per step and the top kernels by time. Writes OUT/report.json and
# OUT/report.md (the side-by-side table and the top kernels). Meant to fit one 8-minute device
# call on one H100 (not run on a GPU yet).
#
#   launch/gpu-bench.sh OUT
#
# Environment as launch/gpu-check.sh's (PYTHON, BUILD_DIR, MLLM_BIN, MLLM_GPU_CHECK_DEVICE=cpu
# for tiny shapes on the CPU: tests/launch/gpu_check_cpu.sh runs it so).
# On the device tool: first, here,
#   launch/deps-prefix.sh fetch .deps/debs && launch/fetch-corpus.sh &&
#   build/bin/mllm-prepare recipes/gpt2-small.yaml
# (the BPE of 50,257 pieces and the shards, so the device does not train them), then carry
# [".deps/debs", "data/full", "data/cache/gpt2-small"], timeout about 560 s, and the command
#   launch/gpu-bench.sh /tmp/gb; cp /tmp/gb/report.* $OUT/;
#   tar czf $OUT/gb.tgz --exclude=checkpoints --exclude='*.trace.json' --exclude=profile -C /tmp gb
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
MLLM_GPU_CHECK_ONLY="sync_debug bench" exec "$(dirname "$0")/gpu-check.sh" "$1"
