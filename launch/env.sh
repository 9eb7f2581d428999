# shellcheck shell=bash
# Source it in a new shell after README command A (`source launch/env.sh`, bash or zsh): the
# card's command then runs as typed,
#   mpirun -np 8 mllm-train recipes/mini.yaml
# It puts this checkout's programs on PATH (MLLM_BUILD_DIR/bin; MLLM_BUILD_DIR: default build,
# relative to the checkout or absolute; PREFIX/bin for an installed copy), sets the OpenMPI
# settings one machine needs (as root: the two allow-run-as-root variables; more ranks than
# cores allowed; no core binding, as launch/mpirun.sh: train.threads sizes each rank's
# threads), and makes `mpirun` a function that runs the real one through launch/clean-stop.sh,
# so that Ctrl-C stops every rank with a checkpoint and mpirun exits 0 (plain mpirun kills the
# ranks a second later and exits 1).
# `command mpirun` is the plain one. Sourcing it again changes nothing more.
if [ -n "${BASH_VERSION:-}" ]; then
  MLLM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
elif [ -n "${ZSH_VERSION:-}" ]; then
  # shellcheck disable=SC2296  # zsh's name of the sourced file
  MLLM_ROOT=$(cd "$(dirname "${(%):-%x}")/.." && pwd)
else
  echo "launch/env.sh: source it from bash or zsh" >&2
  return 2 2> /dev/null || exit 2
fi
export MLLM_ROOT
case "${MLLM_BUILD_DIR:-build}" in
  /*) _mllm_bin=${MLLM_BUILD_DIR}/bin ;;
  *) _mllm_bin=$MLLM_ROOT/${MLLM_BUILD_DIR:-build}/bin ;;
esac
# An installed copy (PREFIX/share/mllm/launch/env.sh): the programs are in PREFIX/bin.
if [ ! -e "$MLLM_ROOT/CMakeLists.txt" ] && [ -x "$MLLM_ROOT/../../bin/mllm-train" ]; then
  _mllm_bin=$(cd "$MLLM_ROOT/../../bin" && pwd)
fi
if [ ! -x "$_mllm_bin/mllm-train" ]; then
  echo "launch/env.sh: no mllm-train in $_mllm_bin yet: run README command A (launch/quickstart.sh) or build first" >&2
fi
case ":$PATH:" in *":$_mllm_bin:"*) ;; *) export PATH="$_mllm_bin:$PATH" ;; esac
unset _mllm_bin
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
mpirun() { "$MLLM_ROOT/launch/clean-stop.sh" mpirun "$@"; }
