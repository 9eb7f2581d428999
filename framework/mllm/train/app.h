// What every mllm program's main() shares: early logging with the launcher's rank, and the
// error boundary that maps exceptions to exit codes (0 done, 2 bad input, 1 anything else)
// and, under MPI, aborts the whole job so that no other rank waits forever.
#pragma once

#include <functional>

namespace mllm {

// Runs `body` and returns its exit code. mllm::Error -> logged with the rank, e.exit_code();
// any other exception -> logged, 1. When MPI is initialised with world > 1 a failing rank calls
// MPI_Abort with that code. Identical bad-input errors (a bad recipe) are printed once, by
// rank 0. Installs console logging at MLLM_LOG_LEVEL (default info) first.
int run_guarded(const char* program, const std::function<int()>& body);

// Rank and world size as the launcher (mpirun / srun) set them in the environment, before MPI
// is initialised; {0, 1} when not launched by one.
std::pair<int, int> launcher_rank_and_size();

}  // namespace mllm
