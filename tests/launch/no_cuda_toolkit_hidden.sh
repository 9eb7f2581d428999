#!/usr/bin/env bash
# The second half of tests/launch/no_cuda_toolkit.sh, run by it as root inside a private mount
# namespace (unshare -m). WORK is its scratch folder, SRC the clone (with .venv linked in).
# Hides the CUDA toolkit: an empty read-only tmpfs over every /usr/local/cuda* folder, and a
# program that exits 97 over every nvcc on PATH and in the wheels' nvidia/cu*/bin; then
# configures, builds mllm-train and trains.
set -euo pipefail
WORK=$1 SRC=$2
: "${MLLM_SOURCE_DIR:?set by ctest}"
fail() { echo "FAIL (mount namespace): $*" >&2; exit 1; }

# ---- hide the toolkit --------------------------------------------------------------------
printf '#!/bin/sh\necho "hidden by tests/launch/no_cuda_toolkit.sh: $0 ran" >&2\nexit 97\n' > "$WORK/nvcc"
chmod +x "$WORK/nvcc"
declare -A seen=()
for d in /usr/local/cuda*; do
  real=$(readlink -f "$d") || continue
  [ -d "$real" ] && [ -z "${seen[$real]:-}" ] || continue
  seen[$real]=1
  mount -t tmpfs -o ro,size=64k none "$real" || fail "mount a tmpfs over $real"
  echo "no_cuda_toolkit: hid $real"
done
site=$("$SRC/.venv/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
mapfile -t nvccs < <({ type -ap nvcc || true; ls "$site"/nvidia/cu*/bin/nvcc 2> /dev/null || true; } | sort -u)
for n in "${nvccs[@]}"; do
  [ -f "$n" ] || continue
  mount --bind "$WORK/nvcc" "$(readlink -f "$n")" || fail "bind mount over $n"
  echo "no_cuda_toolkit: hid $n"
done
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDACXX CUDAToolkit_ROOT CUDA_TOOLKIT_ROOT_DIR
for n in $(type -ap nvcc || true) /usr/local/cuda/bin/nvcc; do
  ! "$n" --version > /dev/null 2>&1 || fail "$n still runs"
done
[ -z "$(ls -A /usr/local/cuda/ 2> /dev/null)" ] || fail "/usr/local/cuda/ is not empty"

# ---- configure as the README does --------------------------------------------------------
# -O1 and no tests or benchmarks: this build only has to prove what it links and that it trains.
t0=$SECONDS
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DMLLM_BUILD_TESTS=OFF \
  -DMLLM_BUILD_BENCH=OFF > "$WORK/configure.log" 2>&1 ||
  { tail -40 "$WORK/configure.log"; fail "configure without a CUDA toolkit"; }
line=$(grep "mllm: build:" "$WORK/configure.log" || true)
echo "no_cuda_toolkit: ${line#-- }"
[ "$(grep -c "mllm: build:" "$WORK/configure.log")" -eq 1 ] || fail "not one 'mllm: build:' line"
[[ "$line" == *"mllm: build: CPU only"*"no CUDA toolkit found"* ]] || fail "not a CPU build: $line"
! grep -q "CUDA_ARCHITECTURES\|Caffe2\|CUDA::" "$WORK/configure.log" ||
  { grep -n "CUDA_ARCHITECTURES\|Caffe2\|CUDA::" "$WORK/configure.log"; fail "CUDA in the configure log"; }
grep -q "^MLLM_WITH_CUDA:STRING=AUTO" "$WORK/build/CMakeCache.txt" || fail "MLLM_WITH_CUDA is not AUTO"
cmake --build "$WORK/build" -j"$(nproc)" --target mllm-train > "$WORK/build.log" 2>&1 ||
  { grep -E "error|undefined" "$WORK/build.log" | head -20; tail -5 "$WORK/build.log"; fail "build"; }
echo "no_cuda_toolkit: configured and built mllm-train in $((SECONDS - t0)) s"

# ---- what it links -----------------------------------------------------------------------
bin="$WORK/build/bin/mllm-train"
libs=$(ldd "$bin")
grep -q "libtorch_cpu.so" <<< "$libs" || fail "mllm-train does not link libtorch_cpu: $libs"
! grep -q -E "libtorch_cuda|libc10_cuda|libtorch\.so|libnccl" <<< "$libs" ||
  fail "mllm-train links LibTorch's CUDA part: $(grep -E "libtorch_cuda|libc10_cuda|libtorch\.so|libnccl" <<< "$libs")"
grep -q "#define MLLM_CUDA_BUILD 0" "$WORK/build/generated/include/mllm/version.h" ||
  fail "version.h: $(grep CUDA "$WORK/build/generated/include/mllm/version.h")"

# ---- it trains, and refuses what needs CUDA ----------------------------------------------
common=("$SRC/tests/assets/tiny.yaml" "data.cache_dir=$WORK/cache" "data.corpus=[$SRC/data/tang300/tang300.jsonl]"
        checkpoint.every_steps=0 eval.every_steps=0)
out=$(OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo mpirun -np 2 --bind-to none \
      --oversubscribe "$bin" "${common[@]}" run.out_dir="$WORK/run" train.max_steps=3 2>&1) ||
  { echo "$out" | tail -30; fail "mllm-train, 3 steps at 2 ranks"; }
grep -q "world size 2 (mpi backend)" <<< "$out" || fail "not a 2-rank mpi run: $(echo "$out" | head -20)"
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "metrics of the 3-step run"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert [r["step"] for r in rows] == [1, 2, 3], rows
assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in rows), rows
print("no_cuda_toolkit: trained 3 steps at 2 ranks, losses", [round(r["loss"], 4) for r in rows])
PY
expect2() {  # PATTERN overrides...: exit 2 and PATTERN in the output, nothing written
  local pattern=$1 code=0
  shift
  "$bin" "${common[@]}" run.out_dir="$WORK/refused" "$@" > "$WORK/log" 2>&1 || code=$?
  [ "$code" -eq 2 ] || { cat "$WORK/log"; fail "$*: exit $code, expected 2"; }
  grep -q -- "$pattern" "$WORK/log" || { cat "$WORK/log"; fail "$*: no '$pattern' in the message"; }
  [ ! -e "$WORK/refused" ] || fail "$*: the refused run wrote its folder"
}
expect2 "this is a CPU build of mllm (LibTorch's CUDA part left out: no CUDA toolkit found" train.device=cuda
grep -q -- "--cuda-wheels" "$WORK/log" || fail "train.device=cuda: the message does not say how to build for GPUs"
expect2 "dist.backend: nccl is not available in this build" dist.backend=nccl
grep -q -- "--cuda-wheels" "$WORK/log" || fail "dist.backend=nccl: the message does not say how to build for GPUs"
echo "no_cuda_toolkit: ok"
