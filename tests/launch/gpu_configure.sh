#!/usr/bin/env bash
# The GPU build's configure step as launch/gpu-check.sh runs it (NCCL, GPU tests, no benches), with
# CMake 4 (the GPU machines' major version; Debian 12 has 3.25), against the CUDA LibTorch that
# CMake here links, with CUDA enabled (nvcc given). The second GPU session's build stopped at this
# step under CMake 4.4 while every CPU build passed. Configures only (~10 s). Skipped (77) without
# CMake 4 in the virtual environment (launch/install-deps.sh puts it there), without a CUDA
# LibTorch, or without nvcc.
source "$(dirname "$0")/../e2e/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest: the Python holding the torch we link}"
CMAKE4=${MLLM_CMAKE4:-$(dirname "$MLLM_TORCH_PYTHON")/cmake}
[ -x "$CMAKE4" ] || { echo "skip: no CMake 4 at $CMAKE4 (launch/install-deps.sh)"; exit 77; }
version=$("$CMAKE4" --version | sed -n 's/^cmake version //p')
[ "${version%%.*}" -ge 4 ] 2>/dev/null || { echo "skip: $CMAKE4 is CMake '$version', not 4"; exit 77; }
cuda=$("$MLLM_TORCH_PYTHON" -c 'import torch; print(torch.version.cuda or "")')
[ -n "$cuda" ] || { echo "skip: LibTorch here has no CUDA"; exit 77; }
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] || { echo "skip: no nvcc"; exit 77; }
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
if ! "$CMAKE4" -S "$MLLM_SOURCE_DIR" -B "$WORK/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DMLLM_PYTHON="$MLLM_TORCH_PYTHON" -DCMAKE_CUDA_COMPILER="$nvcc" -DMLLM_WITH_NCCL=ON \
     -DMLLM_GPU_TESTS=ON -DMLLM_NCCL_TEST_NP=1 -DMLLM_BUILD_BENCH=OFF > "$WORK/configure.log" 2>&1; then
  { grep -n -A4 'Error' "$WORK/configure.log" || tail -40 "$WORK/configure.log"; } | head -60 || true
  fail "CMake $version could not configure the GPU build (CUDA $cuda LibTorch)"
fi
grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.*nvcc' "$WORK/build/CMakeCache.txt" ||
  fail "CUDA was not enabled in the configured build (no CMAKE_CUDA_COMPILER): the test proves nothing"
grep -q 'mllm_nccl_tests' "$WORK/build/build.ninja" "$WORK/build/Makefile" 2>/dev/null ||
  fail "the configured GPU build has no mllm_nccl_tests target"
echo "CMake $version configures the GPU build (CUDA $cuda LibTorch, nvcc $nvcc, NCCL, GPU tests)"
