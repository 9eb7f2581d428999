// The shared error boundary of the mllm programs.
#include "mllm/train/app.h"

#include <cstdlib>
#include <exception>
#include <string>

#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/distributed/communicator.h"

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; OpenMPI's C++ bindings need libmpi_cxx
#endif
#include <mpi.h>

namespace mllm {

std::pair<int, int> launcher_rank_and_size() {
  for (auto [r, s] : {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                      std::pair{"PMIX_RANK", "PMIX_SIZE"}, std::pair{"PMI_RANK", "PMI_SIZE"},
                      std::pair{"SLURM_PROCID", "SLURM_NTASKS"}}) {
    const char* rank = std::getenv(r);
    const char* size = std::getenv(s);
    if (rank && size) return {std::atoi(rank), std::atoi(size)};
  }
  return {0, 1};
}

int run_guarded(const char* program, const std::function<int()>& body) {
  auto [rank, world] = launcher_rank_and_size();
  std::string level = "info";
  try {
    level = resolve_log_level("info");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s; using info\n", program, e.what());
  }
  init_logging(rank, world, level);
  int code = 0;
  try {
    return body();
  } catch (const ConfigError& e) {
    // Before MPI starts every rank parsed the same recipe and failed the same way: one message
    // is enough. After, an error may be one rank's alone (a plugin missing on one node): show it.
    int mpi_up = 0;
    MPI_Initialized(&mpi_up);
    if (rank == 0 || mpi_up) spdlog::error("{}", e.what());
    else spdlog::debug("{}", e.what());
    code = e.exit_code();
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    code = e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("{}: unexpected error: {}", program, e.what());
    code = 1;
  }
  flush_logs();
  abort_job(code);  // returns unless MPI is up with several ranks
  return code;
}

}  // namespace mllm
