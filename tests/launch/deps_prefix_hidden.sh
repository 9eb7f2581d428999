#!/usr/bin/env bash
# The second half of tests/launch/deps_prefix.sh, run by it inside a private mount namespace
# (unshare -m) as root: WORK holds the unpacked prefix (WORK/prefix), SRC the clean clone (its
# .venv linked in). Every regular file of the system's copies of the prefix's build dependencies
# (sentencepiece, yaml-cpp, spdlog, fmt, CLI11, nlohmann-json, zlib's headers, OpenMPI, PMIx,
# pkg-config) is covered by a bind mount of a file that fails loudly when used: a header that is
# an #error, a CMake file that is a FATAL_ERROR, a program that exits 97, an empty library. The
# CUDA toolkit is hidden too: an empty read-only tmpfs over every /usr/local/cuda* folder, the
# failing program over every nvcc on PATH and in the wheels' nvidia/cu*/bin. Then the clone is
# configured and built against the prefix alone (libmllm, mllm_spm, mllm-train) as the CPU build,
# trains three steps at 2 ranks with the prefix's mpirun, with the BPE tokenizer, so that
# libmllm_spm loads the prefix's sentencepiece at run time, and refuses what needs CUDA.
set -euo pipefail
WORK=$1 SRC=$2
: "${MLLM_SOURCE_DIR:?set by ctest}"
fail() { echo "FAIL (mount namespace): $*" >&2; exit 1; }
P="$WORK/prefix/usr"
HIDE=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libsentencepiece-dev
      libsentencepiece0 libcli11-dev nlohmann-json3-dev zlib1g-dev libopenmpi-dev libopenmpi3 openmpi-bin
      openmpi-common libpmix2 libpmix-dev pkgconf pkgconf-bin pkg-config libpkgconf3 libzstd-dev
      libsimdjson-dev libsimdjson14)

# ---- hide the system's copies ------------------------------------------------------------
mkdir -p "$WORK/poison"
printf '#error "hidden by tests/launch/deps_prefix.sh: the build used a system header, not the prefix'"'"'s"\n' \
  > "$WORK/poison/header"
printf 'message(FATAL_ERROR "hidden by tests/launch/deps_prefix.sh: CMake found the system'"'"'s ${CMAKE_CURRENT_LIST_FILE}")\n' \
  > "$WORK/poison/cmake"
printf '#!/bin/sh\necho "hidden by tests/launch/deps_prefix.sh: the system'"'"'s $0 ran, not the prefix'"'"'s" >&2\nexit 97\n' \
  > "$WORK/poison/program"
chmod +x "$WORK/poison/program"
: > "$WORK/poison/empty"
hidden=0 packages=()
for pkg in "${HIDE[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || continue
  packages+=("$pkg")
  while IFS= read -r f; do
    # Regular files only: a bind mount on a link would land on its target, which may belong
    # to a package that stays (libz.so -> zlib1g's libz.so.1). Links into hidden files are
    # covered through their targets.
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    case "$f" in
      /usr/include/*) poison=header ;;
      *.cmake) poison=cmake ;;
      *) if [ -x "$f" ] && [[ "$f" == */bin/* ]]; then poison=program; else poison=empty; fi ;;
    esac
    mount --bind "$WORK/poison/$poison" "$f" || fail "bind mount over $f"
    hidden=$((hidden + 1))
  done < <(dpkg -L "$pkg")
done
echo "deps_prefix: hid $hidden files of ${#packages[@]} system packages (${packages[*]:-none installed})"
if [ -e /usr/include/sentencepiece_processor.h ]; then
  grep -q "hidden by" /usr/include/sentencepiece_processor.h || fail "the system's sentencepiece header is not hidden"
fi

# ---- hide the CUDA toolkit ---------------------------------------------------------------
declare -A seen=()
for d in /usr/local/cuda*; do
  real=$(readlink -f "$d") || continue
  [ -d "$real" ] && [ -z "${seen[$real]:-}" ] || continue
  seen[$real]=1
  mount -t tmpfs -o ro,size=64k none "$real" || fail "mount a tmpfs over $real"
  echo "deps_prefix: hid $real"
done
site=$("$SRC/.venv/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
mapfile -t nvccs < <({ type -ap nvcc || true; ls "$site"/nvidia/cu*/bin/nvcc 2> /dev/null || true; } | sort -u)
for n in "${nvccs[@]}"; do
  [ -f "$n" ] || continue
  mount --bind "$WORK/poison/program" "$(readlink -f "$n")" || fail "bind mount over $n"
  echo "deps_prefix: hid $n"
done
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDACXX CUDAToolkit_ROOT CUDA_TOOLKIT_ROOT_DIR
for n in $(type -ap nvcc || true) /usr/local/cuda/bin/nvcc; do
  ! "$n" --version > /dev/null 2>&1 || fail "$n still runs"
done
[ -z "$(ls -A /usr/local/cuda/ 2> /dev/null)" ] || fail "/usr/local/cuda/ is not empty"

# ---- the prefix alone --------------------------------------------------------------------
# The OpenMPI settings ctest exports would mask a lost openmpi-mca-params.conf: the prefix's own
# file must be what selects the transport.
unset OMPI_MCA_pml OMPI_MCA_btl OMPI_MCA_mtl
# shellcheck disable=SC1091
source "$WORK/prefix/env.sh"
for tool in pkg-config mpicxx mpirun; do
  [ "$(command -v $tool)" = "$P/bin/$tool" ] || fail "env.sh: $tool is $(command -v $tool)"
done
cflags=$(pkg-config --cflags sentencepiece) || fail "pkg-config sentencepiece"
[[ "$cflags" == *"-I$P/include"* ]] || fail "pkg-config --cflags sentencepiece gave '$cflags'"
src=$(ompi_info --parsable --param pml all --level 9 | sed -n 's/^mca:pml:base:param:pml:source://p')
[[ "$src" == *"$WORK/prefix/etc/openmpi/openmpi-mca-params.conf"* ]] ||
  fail "OpenMPI did not read the prefix's openmpi-mca-params.conf (pml source: '$src'; OPAL_SYSCONFDIR?)"

# A program of the prefix's yaml-cpp, spdlog/fmt and MPI under the prefix's mpirun.
cat > "$WORK/t.cpp" <<'CPP'
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int sum = 0, one = YAML::Load("{x: 1}")["x"].as<int>();
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) spdlog::info("sum {} of {}", sum, size);
  MPI_Finalize();
  return sum == size ? 0 : 1;
}
CPP
mpicxx -std=c++17 "$WORK/t.cpp" -o "$WORK/t" -DSPDLOG_FMT_EXTERNAL -I"$P/include" -L"$P/lib/x86_64-linux-gnu" \
  -lyaml-cpp -lspdlog -lfmt -Wl,-rpath,"$P/lib/x86_64-linux-gnu" 2> "$WORK/cc.log" || { cat "$WORK/cc.log"; fail "compile"; }
grep -q "$P" <<<"$(mpicxx --showme:incdirs)" || fail "mpicxx is not relocated: $(mpicxx --showme:incdirs)"
out=$(mpirun -np 2 --bind-to none --oversubscribe "$WORK/t" 2>&1) || { echo "$out"; fail "run under the prefix's mpirun"; }
grep -q "sum 2 of 2" <<< "$out" || fail "2-rank run: $out"
! grep -q "Sorry! You were supposed to get help" <<< "$out" || fail "PMIx/OpenMPI help files not found: $out"

# ---- mllm itself -------------------------------------------------------------------------
# -O1: this build only has to prove where every dependency comes from, that it needs no CUDA
# toolkit, and that it trains. Configured as the README does it (no -D for CUDA or LibTorch).
t0=$SECONDS
# shellcheck disable=SC2046
cmake -S "$SRC" -B "$WORK/build" -DMLLM_BUILD_TESTS=OFF -DMLLM_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_RELEASE=-O1 $("$SRC/launch/deps-prefix.sh" cmake-args "$WORK/prefix") \
  > "$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log"; fail "configure against the prefix"; }
line=$(grep "mllm: build:" "$WORK/cmake.log" || true)
echo "deps_prefix: ${line#-- }"
[ "$(grep -c "mllm: build:" "$WORK/cmake.log")" -eq 1 ] || fail "not one 'mllm: build:' configure line"
[[ "$line" == *"mllm: build: CPU only"*"no CUDA toolkit found"* ]] || fail "not the CPU build: $line"
! grep -q "CUDA_ARCHITECTURES\|Caffe2\|CUDA::" "$WORK/cmake.log" ||
  { grep -n "CUDA_ARCHITECTURES\|Caffe2\|CUDA::" "$WORK/cmake.log"; fail "CUDA in the configure log"; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$WORK/build/CMakeCache.txt"; }
[ "$(cache MLLM_WITH_CUDA)" = AUTO ] || fail "MLLM_WITH_CUDA is '$(cache MLLM_WITH_CUDA)', not AUTO"
for var in yaml-cpp_DIR spdlog_DIR fmt_DIR CLI11_DIR nlohmann_json_DIR MPI_C_COMPILER PKG_CONFIG_EXECUTABLE \
           SENTENCEPIECE_INCLUDEDIR pkgcfg_lib_SENTENCEPIECE_sentencepiece ZLIB_INCLUDE_DIR; do
  [[ "$(cache "$var")" == "$P"* ]] || fail "$var is '$(cache "$var")', not from the prefix"
done
cmake --build "$WORK/build" -j"$(nproc)" --target mllm mllm_spm mllm-train > "$WORK/build.log" 2>&1 ||
  { grep -E "error|undefined|hidden by" "$WORK/build.log" | head -20; tail -5 "$WORK/build.log"; fail "build against the prefix"; }
echo "deps_prefix: configured and built libmllm, mllm_spm, mllm-train against the prefix in $((SECONDS - t0)) s"
python3 - "$WORK/build/compile_commands.json" "$P/include" <<'PY' || fail "mllm_spm's compile line"
import json, sys
cmds = [c["command"] for c in json.load(open(sys.argv[1])) if c["file"].endswith("spm_module.cpp")]
ok = cmds and any(("-I" + sys.argv[2]) in c or ("-isystem " + sys.argv[2]) in c for c in cmds)
print("spm_module.cpp:", cmds[0] if cmds else "not built")
sys.exit(0 if ok else 1)
PY
spm=$(find "$WORK/build" -name 'libmllm_spm.so' | head -1)
# Here-strings, not pipes: grep -q stops reading at the match, and under pipefail the writer's
# SIGPIPE failed the check although the line was there (seen once in CI).
grep -q "$P/lib/x86_64-linux-gnu/libsentencepiece.so" <<<"$(ldd "$spm")" || fail "libmllm_spm: $(ldd "$spm")"
bin="$WORK/build/bin/mllm-train"
libs=$(ldd "$bin")
grep -q "$P/lib/x86_64-linux-gnu/libyaml-cpp" <<< "$libs" || fail "mllm-train: $libs"
# The CPU build: LibTorch's CPU part only (libtorch_cpu still loads the wheel's CUDA runtime and
# CUPTI for its profiler; no CUDA code runs).
grep -q "libtorch_cpu.so" <<< "$libs" || fail "mllm-train does not link libtorch_cpu: $libs"
! grep -q -E "libtorch_cuda|libc10_cuda|libtorch\.so|libnccl" <<< "$libs" ||
  fail "mllm-train links LibTorch's CUDA part: $(grep -E "libtorch_cuda|libc10_cuda|libtorch\.so|libnccl" <<< "$libs")"
grep -q "#define MLLM_CUDA_BUILD 0" "$WORK/build/generated/include/mllm/version.h" ||
  fail "version.h: $(grep CUDA "$WORK/build/generated/include/mllm/version.h")"

# Three steps at 2 ranks, the BPE tokenizer trained and loaded through the prefix's sentencepiece.
run="$WORK/run"
common=("$SRC/tests/assets/tiny.yaml" "data.cache_dir=$WORK/cache" "data.corpus=[$SRC/data/tang300/tang300.jsonl]"
        "data.tokenizer={type: bpe, vocab_size: 3000}" checkpoint.every_steps=0 eval.every_steps=0)
out=$(OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
      mpirun -np 2 --bind-to none --oversubscribe "$bin" "${common[@]}" run.out_dir="$run" \
      train.max_steps=3 2>&1) ||
  { echo "$out" | tail -30; fail "mllm-train at 2 ranks under the prefix's mpirun"; }
grep -q "world size 2 (mpi backend)" <<< "$out" || fail "not a 2-rank mpi run: $(echo "$out" | head -20)"
grep -q "device cpu" <<< "$out" || fail "not a CPU run: $(echo "$out" | head -20)"
! grep -q "Sorry! You were supposed to get help" <<< "$out" || fail "PMIx/OpenMPI help files not found"
python3 - "$run/metrics.jsonl" <<'PY' || fail "metrics of the 3-step run"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert [r["step"] for r in rows] == [1, 2, 3], rows
assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in rows), rows
print("deps_prefix: trained", len(rows), "steps at 2 ranks, losses", [round(r["loss"], 4) for r in rows])
PY

# What needs CUDA is refused: exit 2, the reason and how to build for GPUs, nothing written.
expect2() {  # PATTERN overrides...
  local pattern=$1 code=0
  shift
  "$bin" "${common[@]}" run.out_dir="$WORK/refused" "$@" > "$WORK/log" 2>&1 || code=$?
  [ "$code" -eq 2 ] || { cat "$WORK/log"; fail "$*: exit $code, expected 2"; }
  grep -q -- "$pattern" "$WORK/log" || { cat "$WORK/log"; fail "$*: no '$pattern' in the message"; }
  grep -q -- "--cuda-wheels" "$WORK/log" || { cat "$WORK/log"; fail "$*: the message does not say how to build for GPUs"; }
  [ ! -e "$WORK/refused" ] || fail "$*: the refused run wrote its folder"
}
expect2 "this is a CPU build of mllm (LibTorch's CUDA part left out: no CUDA toolkit found" train.device=cuda
expect2 "dist.backend: nccl is not available in this build" dist.backend=nccl
echo "deps_prefix: the CPU build refuses train.device=cuda and dist.backend=nccl (exit 2)"
