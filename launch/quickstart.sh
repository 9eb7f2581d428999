#!/usr/bin/env bash
# README command A: installs the dependencies, builds, fetches the Tang corpus and trains
# recipes/mini.yaml with 8 ranks on this machine. Extra arguments go to mllm-train as
# overrides, e.g. launch/quickstart.sh train.max_steps=100.
#   NP=8 (ranks)   BUILD_DIR=build   RECIPE=recipes/mini.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-8}
BUILD_DIR=${BUILD_DIR:-build}
RECIPE=${RECIPE:-recipes/mini.yaml}
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

# Each phase's wall time, printed at the end (README's figures come from these lines).
times=()
phase() {  # NAME COMMAND...
  local name=$1 t0=$SECONDS
  shift
  "$@"
  times+=("$name $(( (SECONDS - t0) / 60 ))m$(( (SECONDS - t0) % 60 ))s")
}
phase deps launch/install-deps.sh
phase configure cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
phase build cmake --build "$BUILD_DIR" -j"$(nproc)" --target mllm-train mllm-prepare mllm-generate
phase corpus launch/fetch-corpus.sh
phase train launch/mpirun.sh -np "$NP" "$BUILD_DIR/bin/mllm-train" "$RECIPE" "$@"
printf -v took '%s, ' "${times[@]}"
echo "quickstart.sh: took ${took%, }" >&2
env_line="source launch/env.sh"
[ "$BUILD_DIR" = build ] || env_line="MLLM_BUILD_DIR=$BUILD_DIR $env_line"
echo "quickstart.sh: done. In a new shell at $(pwd): $env_line, then e.g." \
  "mpirun -np $NP mllm-train $RECIPE (it resumes runs/ from their checkpoints)" >&2
