#!/usr/bin/env bash
# Installs what building mllm and the main job need on Debian 12: Debian's packages (with sudo
# when not root) and LibTorch, from PyPI's torch wheel, into a project-local virtual environment
# (.venv; CMake finds it there). No system Python package is changed. Idempotent.
#
#   launch/install-deps.sh                build + main job (README command A)
#   launch/install-deps.sh --tests        also what only the tests use (README command B): a one-node
#                                         Slurm (slurmctld, slurmd, munge; their services are kept
#                                         from starting) and iproute2
#   launch/install-deps.sh --cuda-wheels  also the CUDA compiler (nvcc, CCCL) from NVIDIA's PyPI
#                                         wheels into .venv, for the GPU build on a machine without
#                                         a CUDA toolkit; done unasked where a GPU is visible and no
#                                         toolkit is found. Without a toolkit CMake makes a CPU build.
#   launch/install-deps.sh --dev          also numpy in .venv (golden-value scripts, ../shared/peer)
# Environment: MLLM_VENV (default <repo>/.venv), MLLM_TORCH_VERSION (default 2.11.0),
# MLLM_PYARROW_VERSION (default 26.0.1), MLLM_TENSORBOARD_VERSION (default 2.21.0),
# MLLM_CMAKE4_VERSION (default 4.4.5), PYTHON.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
DEV=0 TESTS=0 CUDA_WHEELS=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --tests) TESTS=1 ;;
    --cuda-wheels) CUDA_WHEELS=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MLLM_VENV:-$ROOT/.venv}"
# The version on our GPU machines (PyTorch 2.11 + CUDA 13): CPU and GPU runs link the same LibTorch.
TORCH_VERSION="${MLLM_TORCH_VERSION:-2.11.0}"
PYARROW_VERSION="${MLLM_PYARROW_VERSION:-26.0.1}"
TENSORBOARD_VERSION="${MLLM_TENSORBOARD_VERSION:-2.21.0}"
CMAKE4_VERSION="${MLLM_CMAKE4_VERSION:-4.4.5}"

say() { echo "install-deps.sh: $*"; }
die() { echo "install-deps.sh: error: $*" >&2; exit 1; }

# ---- what this machine must be ---------------------------------------------------------------
# Checked before anything is installed, so that a machine that cannot work stops here with the
# reason, not in the middle of a download or at a CMake error.
command -v apt-get > /dev/null && command -v dpkg-query > /dev/null ||
  die "no apt-get: this script installs Debian 12's packages. On another system install the" \
      "packages listed in $0 by hand, then LibTorch with: python3 -m venv .venv &&" \
      ".venv/bin/pip install torch==$TORCH_VERSION pyarrow==$PYARROW_VERSION"
case "$(uname -m)" in
  x86_64|aarch64) ;;
  *) die "PyPI has no torch $TORCH_VERSION wheel for $(uname -m) (x86_64 and aarch64 only)" ;;
esac
if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  os=$(. /etc/os-release && echo "${ID:-?} ${VERSION_ID:-?}")
  [ "$os" = "debian 12" ] ||
    echo "install-deps.sh: note: written for Debian 12; this is '$os' (package names may differ)" >&2
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null || die "not root and no sudo: run as root, or install sudo"
  SUDO="sudo"
fi

# Free space for LibTorch: .venv holds ~5.0 GB with the nvidia-* wheels torch brings (CUDA
# runtime, cuBLAS, cuDNN, NCCL; measured), and pip keeps the 2.7 GB of downloaded wheels in TMPDIR
# until it has installed them all.
free_gib() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
need_space() {  # DIR GIB WHAT
  local dir=$1 have
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  have=$(free_gib "$dir")
  [ -z "$have" ] || [ "$have" -ge "$2" ] ||
    die "$3 needs about $2 GiB free on $(df -P "$dir" | awk 'NR == 2 { print $6 }'), which has" \
        "$have GiB. Free some, or point MLLM_VENV / TMPDIR at a larger disk."
}

# ---- Debian's packages -----------------------------------------------------------------------
PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev zlib1g-dev libzstd-dev libsimdjson-dev   # .gz / .zst / .jsonl corpora
  libgtest-dev libbenchmark-dev  # the default configure builds the tests and benchmarks
  xz-utils                    # the embedded corpus is .jsonl.xz
  zstd                        # .zst corpus files (and the tests' bench/make_corpus.py)
  gnuplot-nox                 # sweep plots
  procps                      # pgrep: launch/sweep.sh stops the trainers of a point by session
)
# Only the tests use these. slurmctld, slurmd and munge are daemons: on a machine with systemd
# their packages would start them at once and at every boot, so they are installed with starting
# forbidden (policy-rc.d) and their services disabled; tests/launch/slurm_live.sh starts its own.
TEST_PACKAGES=(
  slurmctld slurmd slurm-client munge   # tests/launch/slurm_live.sh: a real one-node Slurm
  iproute2                              # tests/launch/two_hosts.sh: network namespaces as hosts
)
DAEMONS=(munge slurmctld slurmd)
[ "$TESTS" -eq 0 ] || PACKAGES+=("${TEST_PACKAGES[@]}")
# A Python >= 3.10 with venv for the torch wheel: the one on PATH if it can make a venv,
# else Debian's (3.11).
PYTHON="${PYTHON:-python3}"
if ! { command -v "$PYTHON" > /dev/null &&
       "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2> /dev/null; }; then
  PYTHON=/usr/bin/python3
  PACKAGES+=(python3 python3-venv)
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2> /dev/null | grep -q "install ok installed"; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PACKAGES[@]} Debian packages already installed"
else
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq ||
    die "apt-get update failed (above): are Debian's mirrors reachable (/etc/apt/sources.list*)?"
  new_daemons=()
  for d in "${DAEMONS[@]}"; do
    [[ " ${missing[*]} " == *" $d "* ]] && new_daemons+=("$d")
  done
  policy=""
  if [ ${#new_daemons[@]} -gt 0 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    # invoke-rc.d asks this script before a package starts a service; 101 = not allowed.
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# written by mllm launch/install-deps.sh while it installs test-only daemons\nexit 101\n' |
      $SUDO tee "$policy" > /dev/null
    $SUDO chmod 755 "$policy"
  fi
  rc=0
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || rc=$?
  [ -z "$policy" ] || $SUDO rm -f "$policy"
  [ "$rc" -eq 0 ] || die "apt-get install failed (above) for: ${missing[*]}"
  if [ ${#new_daemons[@]} -gt 0 ] && command -v systemctl > /dev/null; then
    $SUDO systemctl disable "${new_daemons[@]/%/.service}" > /dev/null 2>&1 || true
    say "${new_daemons[*]}: installed for the tests, services disabled (not started, not at boot)"
  fi
fi
if [ "$PYTHON" = /usr/bin/python3 ]; then
  "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2> /dev/null ||
    die "$PYTHON cannot make a virtual environment of Python >= 3.10 (python3-venv installed?)"
fi

# ---- LibTorch and the other wheels, in .venv -------------------------------------------------
has_version() {  # PACKAGE VERSION: is exactly that version in .venv?
  [ -x "$VENV/bin/python3" ] &&
    "$VENV/bin/python3" - "$1" "$2" 2> /dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version(sys.argv[1]).split("+")[0] != sys.argv[2])
PY
}
pip_install() {  # WHAT SPEC...: one pip call, its failure explained
  local what=$1
  shift
  say "pip install $* into $VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir "$@" ||
    die "could not install $what from PyPI (pip's messages above). pip reads its index and" \
        "proxy from /etc/pip.conf, ~/.config/pip/pip.conf or PIP_INDEX_URL; check that one is" \
        "reachable, then run this script again (what is installed stays)."
}

# LibTorch with CUDA: the torch wheel and the nvidia-* wheels it depends on (CUDA runtime, cuBLAS,
# cuDNN, NCCL, ...), which libtorch_cuda.so finds through its RUNPATH. About 5.0 GB installed.
# Without a CUDA toolkit, CMake uses its CPU part alone (cmake/MllmTorch.cmake).
if has_version torch "$TORCH_VERSION"; then
  say "torch $TORCH_VERSION already in $VENV"
else
  need_space "$VENV" 6 "torch $TORCH_VERSION with its CUDA libraries (.venv ~5.0 GB)"
  need_space "${TMPDIR:-/tmp}" 4 "pip's downloads of torch and its CUDA libraries (2.7 GB)"
  [ -x "$VENV/bin/python3" ] || "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv $VENV failed"
  pip_install "torch $TORCH_VERSION" "torch==$TORCH_VERSION"
fi
# Apache Arrow's C++ libraries with their headers, from PyPI's pyarrow wheel (as LibTorch from
# torch's): mllm-prepare reads Parquet corpora through them (data/parquet_module).
has_version pyarrow "$PYARROW_VERSION" || pip_install "pyarrow $PYARROW_VERSION" "pyarrow==$PYARROW_VERSION"
# TensorBoard: tests/e2e/observe.sh reads log.tensorboard's event files back with its own reader;
# users run `.venv/bin/tensorboard --logdir RUN/tensorboard` (docs/observability.md).
has_version tensorboard "$TENSORBOARD_VERSION" ||
  pip_install "tensorboard $TENSORBOARD_VERSION" "tensorboard==$TENSORBOARD_VERSION"
# CMake 4 from PyPI, the major version on the GPU machines (their image has 4.4 from pip, where
# Debian 12 has 3.25): launch.gpu_configure configures the GPU build with it, so that a CMake 4
# failure shows here before a GPU session's minutes are spent on it. Not on PATH; the build uses
# the system's CMake.
has_version cmake "$CMAKE4_VERSION" || pip_install "CMake $CMAKE4_VERSION" "cmake==$CMAKE4_VERSION"
if [ "$DEV" -eq 1 ]; then
  "$VENV/bin/python3" -c 'import numpy' 2> /dev/null || pip_install numpy numpy
fi

# ---- the CUDA toolkit: the system's, NVIDIA's wheels, or none (a CPU build) ------------------
nvcc_works() { [ -n "$1" ] && "$1" --version > /dev/null 2>&1; }
system_nvcc=""
for c in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
  if nvcc_works "$c"; then system_nvcc=$c; break; fi
done
gpus=0
if command -v nvidia-smi > /dev/null; then
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
elif [ -d /proc/driver/nvidia/gpus ]; then
  gpus=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 | wc -l)
fi

# The compiler wheels of the CUDA version torch was built with, next to the runtime wheels torch
# brought: nvidia/cuNN/{bin/nvcc, nvvm, include (CCCL, crt)}. Sets CUDA_TK (the toolkit folder),
# or CUDA_FAIL (why not) and returns 1.
CUDA_TK="" CUDA_FAIL=""
install_cuda_wheels() {
  local spec major site t
  spec=$("$VENV/bin/python3" - <<'PY'
import re, sys
from importlib.metadata import requires
for r in requires("torch") or []:
    m = re.match(r"cuda-toolkit\[[^\]]*\]\s*==\s*([0-9.]+)", r)
    if m:
        print(m.group(1)); sys.exit(0)
sys.exit(1)
PY
) || { CUDA_FAIL="torch $TORCH_VERSION names no cuda-toolkit wheel (torch >= 2.10 with CUDA 13 does)"; return 1; }
  major=${spec%%.*}
  site=$("$VENV/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  CUDA_TK="$site/nvidia/cu$major"
  if ! nvcc_works "$CUDA_TK/bin/nvcc" || [ ! -d "$CUDA_TK/include/cccl" ] ||
     [ ! -x "$CUDA_TK/nvvm/bin/cicc" ]; then
    say "pip install cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==$spec into $VENV (~0.2 GB)"
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir \
      "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==$spec" ||
      { CUDA_FAIL="pip could not install cuda-toolkit[nvcc,...]==$spec (above)"; return 1; }
  fi
  # nvcc links with -L<toolkit>/lib64 and CMake looks for libcudart.so; the wheels have
  # lib/libcudart.so.N only.
  [ -e "$CUDA_TK/lib64" ] || ln -s lib "$CUDA_TK/lib64"
  [ -e "$CUDA_TK/lib/libcudart.so" ] || ln -s "libcudart.so.$major" "$CUDA_TK/lib/libcudart.so"
  # Proof that they make a working toolkit: a kernel using CUB (CCCL) compiled and linked.
  t=$(mktemp -d)
  cat > "$t/probe.cu" <<'CU'
#include <cub/cub.cuh>
__global__ void probe(float* x) { x[threadIdx.x] += 1.f; }
int main() { float* d = nullptr; if (cudaMalloc(&d, 16) == cudaSuccess) probe<<<1, 4>>>(d); return 0; }
CU
  if ! "$CUDA_TK/bin/nvcc" -arch=sm_90 "$t/probe.cu" -o "$t/probe" > "$t/log" 2>&1; then
    tail -5 "$t/log" >&2
    rm -rf "$t"
    CUDA_FAIL="nvcc from the wheels at $CUDA_TK could not compile and link a CUDA program (above)"
    return 1
  fi
  rm -rf "$t"
}

if [ -n "$system_nvcc" ]; then
  say "CUDA toolkit: $system_nvcc ($("$system_nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'));" \
      "CMake makes the CUDA build"
elif [ "$CUDA_WHEELS" -eq 1 ] || [ "$gpus" -gt 0 ]; then
  why="asked for (--cuda-wheels)"
  [ "$CUDA_WHEELS" -eq 1 ] || why="$gpus GPU(s) visible and no CUDA toolkit installed"
  if install_cuda_wheels; then
    say "CUDA toolkit: NVIDIA's wheels in $CUDA_TK ($why); CMake makes the CUDA build"
  else
    # A toolkit CMake would pick but cannot use is worse than none: take the compiler back out.
    "$VENV/bin/python3" -m pip uninstall -q -y nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm \
      nvidia-cuda-cccl > /dev/null 2>&1 || true
    msg="no usable CUDA compiler from NVIDIA's wheels: $CUDA_FAIL; removed again. CMake makes a CPU build"
    [ "$CUDA_WHEELS" -eq 0 ] || die "$msg (--cuda-wheels asked for it)"
    echo "install-deps.sh: warning: $msg" >&2
  fi
else
  say "no CUDA toolkit and no GPU: CMake makes a CPU build (it trains on CPUs; --cuda-wheels adds" \
      "the CUDA compiler from NVIDIA's wheels for a GPU build)"
fi
