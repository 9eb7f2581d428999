// The shared error boundary of the mllm programs.
#include "mllm/train/app.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include "mllm/core/crash_report.h"
#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/core/recipe.h"
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

std::string resolve_recipe_path(const std::string& arg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) return arg;
  // A file of the working directory before a bundled recipe of the same name.
  if (fs::is_regular_file(arg + ".yaml", ec)) return arg + ".yaml";
  const std::string share = share_dir();
  const fs::path recipes = fs::path(share) / "recipes";
  if (arg.find('/') == std::string::npos && !arg.empty() && !share.empty()) {
    for (const std::string& name : {arg, arg + ".yaml"})
      if (fs::is_regular_file(recipes / name, ec)) return (recipes / name).string();
  }
  std::vector<std::string> bundled;
  if (!share.empty())
    for (const auto& e : fs::directory_iterator(recipes, ec))
      if (e.path().extension() == ".yaml") bundled.push_back(e.path().stem().string());
  std::sort(bundled.begin(), bundled.end());
  const bool by_name = arg.find('/') == std::string::npos;
  std::string hint;
  if (!bundled.empty())
    hint = fmt::format(fmt::runtime(by_name ? ", and no bundled recipe of that name in {} (bundled: {})"
                               : "; bundled recipes, by name, in {}: {}"),
                       recipes.string(), fmt::join(bundled, ", "));
  throw ConfigError(fmt::format("recipe '{}' not found: no such file{}", arg, hint));
}

int report_error(const char* program) {
  const int rank = launcher_rank_and_size().first;
  int code = 1;
  try {
    throw;
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
  } catch (...) {
    spdlog::error("{}: unexpected error (not a std::exception)", program);
    code = 1;
  }
  flush_logs();
  abort_job(code);  // returns unless MPI is up with several ranks
  return code;
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
  install_crash_report(rank);
  try {
    return body();
  } catch (...) {
    return report_error(program);
  }
}

}  // namespace mllm
