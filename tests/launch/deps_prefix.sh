#!/usr/bin/env bash
# The build with nothing but Debian's packages unpacked into a prefix and the torch wheel: no
# system copy of the build's dependencies, and no CUDA toolkit (issue 53: README's commands on a
# machine without one). launch/deps-prefix.sh, the hard way: fetch the project's Debian packages,
# unpack them without root or dpkg into a temporary prefix, then, inside a mount namespace where
# the system's copies of those packages, every /usr/local/cuda* folder and every nvcc are hidden
# (tests/launch/deps_prefix_hidden.sh), configure a clean clone of the working tree against the
# prefix (LibTorch from the clone's .venv, this checkout's): CMake must choose the CPU build by
# itself and say so in one line; build it, link no part of LibTorch's CUDA, train three steps at
# 2 ranks with the prefix's mpirun, and refuse train.device=cuda and dist.backend=nccl with exit
# 2 and how to build for GPUs. One build serves both proofs (each costs ~5 minutes of CI).
# Needs apt and Debian's mirrors (CI has both) and a mount namespace (unshare -m, as root); without
# them it is skipped (exit 77, with the reason). MLLM_TEST_DEBS=DIR reuses a folder of .deb files
# that `deps-prefix.sh fetch DIR` made before (saves the download when run by hand). The clone is a
# `git clone` when the working tree has no uncommitted change, else its tracked and unignored
# files.
source "$(dirname "$0")/../e2e/common.sh"
D="$MLLM_SOURCE_DIR/launch/deps-prefix.sh"

if [ -n "${MLLM_TEST_DEBS:-}" ]; then
  DEBS=$MLLM_TEST_DEBS
else
  if ! command -v apt-get > /dev/null; then echo "SKIP: no apt-get"; exit 77; fi
  DEBS="$WORK/debs"
  if ! "$D" fetch "$DEBS" > "$WORK/fetch.log" 2>&1; then
    if grep -q -E "Could not resolve|Failed to fetch|Temporary failure" "$WORK/fetch.log"; then
      echo "SKIP: Debian mirrors unreachable"; exit 77
    fi
    cat "$WORK/fetch.log"; fail "fetch"
  fi
fi
for p in libyaml-cpp-dev libspdlog-dev libfmt9 libopenmpi3 openmpi-bin libgtest-dev pkgconf pkgconf-bin \
         libpkgconf3 libsentencepiece-dev libpmix2; do
  grep -qx "$p" "$DEBS/packages.txt" || fail "fetch did not get $p"
done
for p in libc6 libstdc++6 gcc-12 python3 zlib1g; do
  ! grep -qx "$p" "$DEBS/packages.txt" || fail "fetch got base package $p"
done
"$D" unpack "$DEBS" "$WORK/prefix" > "$WORK/unpack.log" || { cat "$WORK/unpack.log"; fail "unpack"; }
P="$WORK/prefix/usr"

# The prefix itself: nothing dangles (F21), pkg-config files are relocated (F1), env.sh exports
# what OpenMPI, PMIx and pkg-config need (F8, F9).
dangling=$(find "$WORK/prefix" -xtype l)
[ -z "$dangling" ] || fail "dangling links in the prefix: $dangling"
[ -e "$P/include/x86_64-linux-gnu/mpi/mpi.h" ] || fail "the mpi include alternative is missing"
stale=$(grep -l -E '^(prefix|libdir|includedir|exec_prefix)=/usr' -r "$P" --include='*.pc' || true)
[ -z "$stale" ] || fail ".pc files still point at /usr: $stale"
grep -q "^prefix=$P\$" "$P/lib/x86_64-linux-gnu/pkgconfig/sentencepiece.pc" || fail "sentencepiece.pc: $(head -1 "$P/lib/x86_64-linux-gnu/pkgconfig/sentencepiece.pc")"
for var in PATH LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH OPAL_PREFIX OPAL_SYSCONFDIR \
           PMIX_MCA_mca_base_component_disable_dlopen PMIX_MCA_pcompress_base_silence_warning; do
  grep -q "^export $var=" "$WORK/prefix/env.sh" || fail "env.sh does not export $var"
done
# The prefix's PMIx loads no plugin from the system's PMIx folder, which on the GPU image holds
# another PMIx version's (it looks there whatever its component path says). This machine's
# own PMIx, when installed, stands in for that one.
sys_pmix=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
if [ -d "$sys_pmix" ]; then
  opened=$( (source "$WORK/prefix/env.sh" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
             LD_DEBUG=files "$P/bin/mpirun" -np 1 true 2>&1) | grep -o "file=$sys_pmix/[^ ]*" | sort -u || true)
  [ -z "$opened" ] || fail "the prefix's PMIx loaded the system's plugins: $opened"
fi
[ -x "$P/bin/pkg-config" ] || fail "no pkg-config in the prefix"

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: hiding the system's packages needs root (unshare -m, bind mounts)"; exit 77; fi
if ! why=$(unshare -m true 2>&1); then echo "SKIP: unshare -m refused: $why"; exit 77; fi
SRC="$WORK/src"
if [ -z "$(git -C "$MLLM_SOURCE_DIR" status --porcelain 2> /dev/null || echo dirty)" ]; then
  git clone -q "$MLLM_SOURCE_DIR" "$SRC" || fail "git clone"
  echo "deps_prefix: a clone of $(git -C "$SRC" rev-parse --short HEAD)"
else
  mkdir -p "$SRC"
  (cd "$MLLM_SOURCE_DIR" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) |
    tar -xf - -C "$SRC" || fail "copying the working tree"
  echo "deps_prefix: the working tree's files (uncommitted changes), as a clone would have them"
fi
[ ! -e "$SRC/build" ] && [ ! -e "$SRC/.venv" ] || fail "the clone has a build or .venv folder"
# The virtual environment launch/install-deps.sh would have made in the clone: this checkout's.
[ -n "${MLLM_TORCH_PYTHON:-}" ] || { echo "SKIP: LibTorch was not taken from a Python's torch (no .venv to give the clone)"; exit 77; }
ln -s "$(cd "$(dirname "$MLLM_TORCH_PYTHON")/.." && pwd)" "$SRC/.venv"
unshare -m --propagation private bash "$MLLM_SOURCE_DIR/tests/launch/deps_prefix_hidden.sh" "$WORK" "$SRC" ||
  fail "inside the namespace (above)"
echo "deps_prefix: ok ($(wc -l < "$DEBS/packages.txt") packages)"
