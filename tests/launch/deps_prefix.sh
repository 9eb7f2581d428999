#!/usr/bin/env bash
# launch/deps-prefix.sh: fetch the project's Debian packages, unpack them without root or dpkg
# into a temporary prefix, then (1) compile and run, under the prefix's relocated OpenMPI with 2
# ranks, a program that uses yaml-cpp, spdlog/fmt and MPI from the prefix, and (2) configure
# mllm against the prefix and check CMake took every dependency from there.
# Needs apt and Debian's mirrors (CI has both); without them it is skipped (exit 77).
source "$(dirname "$0")/../e2e/common.sh"
D="$MLLM_SOURCE_DIR/launch/deps-prefix.sh"

if ! command -v apt-get > /dev/null; then echo "SKIP: no apt-get"; exit 77; fi
if ! "$D" fetch "$WORK/debs" > "$WORK/fetch.log" 2>&1; then
  if grep -q -E "Could not resolve|Failed to fetch|Temporary failure" "$WORK/fetch.log"; then
    echo "SKIP: Debian mirrors unreachable"; exit 77
  fi
  cat "$WORK/fetch.log"; fail "fetch"
fi
for p in libyaml-cpp-dev libspdlog-dev libfmt9 libopenmpi3 openmpi-bin libgtest-dev; do
  grep -qx "$p" "$WORK/debs/packages.txt" || fail "fetch did not get $p"
done
for p in libc6 libstdc++6 gcc-12 python3; do
  ! grep -qx "$p" "$WORK/debs/packages.txt" || fail "fetch got base package $p"
done
"$D" unpack "$WORK/debs" "$WORK/prefix" > /dev/null || fail "unpack"
P="$WORK/prefix/usr"
# shellcheck disable=SC1091
source "$WORK/prefix/env.sh"
[ "$(command -v mpicxx)" = "$P/bin/mpicxx" ] || fail "env.sh: mpicxx is $(command -v mpicxx)"

# (1) A program built only from the prefix (no system include or library path for these).
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
mpicxx --showme:incdirs | grep -q "$P" || fail "mpicxx is not relocated: $(mpicxx --showme:incdirs)"
out=$(mpirun -np 2 --bind-to none --oversubscribe "$WORK/t" 2>&1) || { echo "$out"; fail "run under the prefix's mpirun"; }
grep -q "sum 2 of 2" <<< "$out" || fail "2-rank run: $out"
ldd "$WORK/t" | grep -q "$P/lib/x86_64-linux-gnu/libyaml-cpp" || fail "libyaml-cpp not from the prefix: $(ldd "$WORK/t")"

# (2) mllm configures against the prefix; yaml-cpp, spdlog, fmt and MPI come from it.
# shellcheck disable=SC2046
cmake -S "$MLLM_SOURCE_DIR" -B "$WORK/build" -DMLLM_BUILD_TESTS=OFF -DMLLM_BUILD_BENCH=OFF \
  $("$D" cmake-args "$WORK/prefix") > "$WORK/cmake.log" 2>&1 || { tail -20 "$WORK/cmake.log"; fail "configure"; }
for var in yaml-cpp_DIR spdlog_DIR fmt_DIR MPI_C_COMPILER; do
  grep "^$var:" "$WORK/build/CMakeCache.txt" | grep -q "$P" ||
    fail "$var not from the prefix: $(grep "^$var:" "$WORK/build/CMakeCache.txt")"
done
echo "deps_prefix: ok ($(wc -l < "$WORK/debs/packages.txt") packages)"
