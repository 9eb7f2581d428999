// spdlog set-up: per-rank console policy and per-rank log files.
#include "mllm/core/logging.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"

namespace mllm {

std::string resolve_log_level(const std::string& recipe_level) {
  const char* env = std::getenv("MLLM_LOG_LEVEL");
  std::string level = (env && *env) ? env : recipe_level;
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" &&
      level != "error")
    throw ConfigError("log level '" + level + "'" + (env && *env ? " (from MLLM_LOG_LEVEL)" : "") +
                      " is not one of trace, debug, info, warn, error");
  return level;
}

void init_logging(int rank, int world_size, const std::string& level, const std::string& log_dir) {
  auto lvl = spdlog::level::from_str(level);
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  // Why only rank 0 at info: N ranks printing the same progress would bury the one line that
  // matters; warnings and errors from any rank still reach the terminal.
  console->set_level(rank == 0 ? lvl : std::max(lvl, spdlog::level::warn));
  std::vector<spdlog::sink_ptr> sinks{console};
  if (!log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    std::string file = fmt::format("{}/rank_{:02d}.log", log_dir, rank);
    try {
      auto f = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, false);
      f->set_level(lvl);
      sinks.push_back(f);
    } catch (const spdlog::spdlog_ex& e) {
      throw Error("cannot open log file " + file + ": " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("mllm", sinks.begin(), sinks.end());
  logger->set_level(lvl);
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [{}/{}] [%^%l%$] %v", rank, world_size));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void flush_logs() {
  if (auto l = spdlog::default_logger()) l->flush();
}

}  // namespace mllm
