// What every mllm program's main() shares: early logging with the launcher's rank, and the
// error boundary that maps exceptions to exit codes (0 done, 2 bad input, 1 anything else)
// and, under MPI, aborts the whole job so that no other rank waits forever.
#pragma once

#include <functional>
#include <string>

namespace mllm {

// Runs `body` and returns its exit code. mllm::Error -> logged with the rank, e.exit_code();
// any other exception -> logged, 1. When MPI is initialised with world > 1 a failing rank calls
// MPI_Abort with that code. Identical bad-input errors (a bad recipe) are printed once, by
// rank 0. Installs console logging at MLLM_LOG_LEVEL (default info) first.
int run_guarded(const char* program, const std::function<int()>& body);

// The error boundary of run_guarded for the exception in flight; call it from a catch block.
// Logs the error (with the rank), flushes the logs and, when MPI is up with world > 1, calls
// MPI_Abort with the exit code (2 for bad input, the Error's code, else 1), so that no peer waits.
// Returns the exit code where nothing was aborted (world 1). Why a separate entry: a program
// calls it while its communicator is still alive, before unwinding would run a teardown that
// can block on peers (an NCCL communicator waiting for a collective they never join).
int report_error(const char* program);

// Rank and world size as the launcher (mpirun / srun) set them in the environment, before MPI
// is initialised; {0, 1} when not launched by one.
std::pair<int, int> launcher_rank_and_size();

// The recipe file a program argument names: `arg` itself when that file exists, else <arg>.yaml;
// otherwise, when `arg` names no folder, the bundled share_dir()/recipes/<arg> or <arg>.yaml
// (share_dir(): core/recipe.h), so `mllm-train mini` works from any folder. Throws ConfigError
// naming what was tried and the bundled recipes when none exists.
std::string resolve_recipe_path(const std::string& arg);

}  // namespace mllm
