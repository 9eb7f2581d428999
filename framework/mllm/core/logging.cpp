// spdlog set-up: per-rank console policy and per-rank log files.
#include "mllm/core/logging.h"

#include <unistd.h>

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

// The status line and the console log lines share this lock: a log line clears the status line,
// prints, and draws it again (StatusAwareSink), so the two never end up on one line.
std::mutex g_console_mutex;
std::string g_status;  // guarded by g_console_mutex; "" = none shown

class StatusAwareSink : public spdlog::sinks::sink {
 public:
  explicit StatusAwareSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(g_console_mutex);
    if (!g_status.empty()) std::fputs("\r\033[K", stderr);
    inner_->log(msg);
    inner_->flush();
    // An error ends the run: the status line goes, so the error is the last thing on screen.
    if (msg.level >= spdlog::level::err) g_status.clear();
    if (!g_status.empty()) {
      std::fputs(g_status.c_str(), stderr);
      std::fflush(stderr);
    }
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

bool is_terminal_path(const std::string& path) {
  return path.rfind("/dev/pts/", 0) == 0 || path.rfind("/dev/tty", 0) == 0;
}
}  // namespace

bool console_is_terminal() {
  static const bool terminal = [] {
    if (::isatty(STDERR_FILENO)) return true;
    if (!std::getenv("OMPI_COMM_WORLD_RANK")) return false;
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(fmt::format("/proc/{}/fd/2", ::getppid()), ec);
    return !ec && is_terminal_path(target.string());
  }();
  return terminal;
}

void set_console_status(const std::string& line) {
  if (!console_is_terminal()) return;
  std::lock_guard<std::mutex> lock(g_console_mutex);
  if (line.empty() && g_status.empty()) return;
  std::fputs("\r\033[K", stderr);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  g_status = line;
}

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
  auto console = std::make_shared<StatusAwareSink>(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
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
