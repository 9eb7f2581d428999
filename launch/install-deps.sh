#!/usr/bin/env bash
# Installs what building mllm, its tests and the main job need on Debian 12: Debian's packages
# (with sudo when not root) and LibTorch, from PyPI's torch wheel, into a project-local virtual
# environment (.venv; CMake finds it there). No system Python package is changed. Idempotent.
#
#   launch/install-deps.sh            build + tests + main job
#   launch/install-deps.sh --dev      also numpy in .venv (golden-value scripts, ../shared/peer)
# Environment: MLLM_VENV (default <repo>/.venv), MLLM_TORCH_VERSION (default 2.11.0),
# MLLM_PYARROW_VERSION (default 26.0.1), MLLM_TENSORBOARD_VERSION (default 2.21.0),
# MLLM_CMAKE4_VERSION (default 4.4.5), PYTHON.
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
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

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps.sh: not root and no sudo" >&2; exit 1; }
  SUDO="sudo"
fi

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev zlib1g-dev libzstd-dev libsimdjson-dev   # .gz / .zst / .jsonl corpora
  libgtest-dev libbenchmark-dev
  xz-utils                    # the embedded corpus is .jsonl.xz
  zstd                        # tests: .zst corpus files (bench/make_corpus.py)
  gnuplot-nox                 # sweep plots
  procps                      # pgrep: launch/sweep.sh stops the trainers of a point by session
  slurmctld slurmd slurm-client munge   # tests/launch/slurm_live.sh: a real one-node Slurm
  iproute2                    # tests/launch/two_hosts.sh: network namespaces as hosts
)
# A Python >= 3.10 with venv for the torch wheel: the one on PATH if it can make a venv,
# else Debian's (3.11).
PYTHON="${PYTHON:-python3}"
if ! { command -v "$PYTHON" >/dev/null &&
       "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }; then
  PYTHON=/usr/bin/python3
  PACKAGES+=(python3 python3-venv)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all ${#PACKAGES[@]} Debian packages already installed"
else
  echo "install-deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# LibTorch with CUDA: the torch wheel and the nvidia-* wheels it depends on (CUDA runtime, cuBLAS,
# cuDNN, NCCL, ...), which libtorch_cuda.so finds through its RUNPATH. About 4.6 GB installed.
# CMake also needs the CUDA toolkit (nvcc, headers) that these machines carry in /usr/local/cuda.
want_torch() {
  [ -x "$VENV/bin/python3" ] &&
    "$VENV/bin/python3" - "$TORCH_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("torch").split("+")[0] != sys.argv[1])
PY
}
if want_torch; then
  echo "install-deps.sh: torch $TORCH_VERSION already in $VENV"
else
  [ -x "$VENV/bin/python3" ] || "$PYTHON" -m venv "$VENV"
  echo "install-deps.sh: pip install torch==$TORCH_VERSION into $VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir "torch==$TORCH_VERSION"
fi
# Apache Arrow's C++ libraries with their headers, from PyPI's pyarrow wheel (as LibTorch from
# torch's): mllm-prepare reads Parquet corpora through them (data/parquet_module).
if ! "$VENV/bin/python3" - "$PYARROW_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("pyarrow") != sys.argv[1])
PY
then
  echo "install-deps.sh: pip install pyarrow==$PYARROW_VERSION into $VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir "pyarrow==$PYARROW_VERSION"
fi
# TensorBoard: tests/e2e/observe.sh reads log.tensorboard's event files back with its own reader;
# users run `.venv/bin/tensorboard --logdir RUN/tensorboard` (docs/observability.md).
if ! "$VENV/bin/python3" - "$TENSORBOARD_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("tensorboard") != sys.argv[1])
PY
then
  echo "install-deps.sh: pip install tensorboard==$TENSORBOARD_VERSION into $VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir "tensorboard==$TENSORBOARD_VERSION"
fi
# CMake 4 from PyPI, the major version on the GPU machines (their image has 4.4 from pip, where
# Debian 12 has 3.25): launch.gpu_configure configures the GPU build with it, so that a CMake 4
# failure shows here before a GPU session's minutes are spent on it. Not on PATH; the build uses
# the system's CMake.
if ! "$VENV/bin/python3" - "$CMAKE4_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("cmake") != sys.argv[1])
PY
then
  echo "install-deps.sh: pip install cmake==$CMAKE4_VERSION into $VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir \
    "cmake==$CMAKE4_VERSION"
fi
if [ "$DEV" -eq 1 ]; then
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --no-cache-dir numpy
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps.sh: warning: no CUDA toolkit (nvcc) found; LibTorch's CMake config needs" \
       "one. Install CUDA toolkit 13 (NVIDIA's Debian repository) into /usr/local/cuda." >&2
fi
