#!/usr/bin/env bash
# README's build on a machine without a CUDA toolkit (issue 53): a clean clone, configured the way
# the README does it (`cmake -S . -B build`, LibTorch from the clone's .venv), inside a mount
# namespace where every /usr/local/cuda* folder and every nvcc are hidden
# (tests/launch/no_cuda_toolkit_hidden.sh). CMake must choose the CPU build by itself and say so
# in one line; mllm-train must link no part of LibTorch's CUDA, train 3 steps at 2 ranks, and
# refuse train.device=cuda and dist.backend=nccl with exit 2 and how to build for GPUs.
# Needs root and unshare -m (skipped, 77, without them). The clone is of the working tree: a
# `git clone` when it has no uncommitted change, else its tracked and unignored files.
source "$(dirname "$0")/../e2e/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest: the Python holding the torch we link}"

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: hiding the CUDA toolkit needs root (unshare -m, mounts)"; exit 77; fi
if ! why=$(unshare -m true 2>&1); then echo "SKIP: unshare -m refused: $why"; exit 77; fi

SRC="$WORK/src"
if [ -z "$(git -C "$MLLM_SOURCE_DIR" status --porcelain 2> /dev/null || echo dirty)" ]; then
  git clone -q "$MLLM_SOURCE_DIR" "$SRC" || fail "git clone"
  echo "no_cuda_toolkit: a clone of $(git -C "$SRC" rev-parse --short HEAD)"
else
  mkdir -p "$SRC"
  (cd "$MLLM_SOURCE_DIR" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) |
    tar -xf - -C "$SRC" || fail "copying the working tree"
  echo "no_cuda_toolkit: the working tree's files (uncommitted changes), as a clone would have them"
fi
[ ! -e "$SRC/build" ] && [ ! -e "$SRC/.venv" ] || fail "the clone has a build or .venv folder"
# The virtual environment launch/install-deps.sh would have made in the clone: this checkout's.
ln -s "$(cd "$(dirname "$MLLM_TORCH_PYTHON")/.." && pwd)" "$SRC/.venv"

unshare -m --propagation private bash "$MLLM_SOURCE_DIR/tests/launch/no_cuda_toolkit_hidden.sh" \
  "$WORK" "$SRC" || fail "inside the namespace (above)"
