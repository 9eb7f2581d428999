// spdlog set-up: per-rank console policy and per-rank log files.
#include "mllm/core/logging.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"

namespace mllm {
namespace {
std::mutex g_log_error_mutex;
std::string g_log_error;
}  // namespace

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
  logger->set_error_handler([](const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(g_log_error_mutex);
      if (!g_log_error.empty()) return;
      std::string m = msg;
      // spdlog: "Failed writing to file X: <strerror>" / "Failed flush to file X: <strerror>".
      for (const char* prefix : {"Failed writing to file ", "Failed flush to file "})
        if (m.rfind(prefix, 0) == 0) m = "cannot write " + m.substr(std::strlen(prefix));
      g_log_error = m;
    }
    std::fprintf(stderr, "mllm: log file: %s\n", msg.c_str());
  });
  {
    std::lock_guard<std::mutex> lock(g_log_error_mutex);
    g_log_error.clear();
  }
  spdlog::set_default_logger(logger);
}

std::string log_write_error() {
  std::lock_guard<std::mutex> lock(g_log_error_mutex);
  return g_log_error;
}

void flush_logs() {
  if (auto l = spdlog::default_logger()) l->flush();
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

}  // namespace mllm
