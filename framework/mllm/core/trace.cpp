// Named ranges for profiler traces (see trace.h).
#include "mllm/core/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>

namespace mllm::trace {
namespace {
std::atomic<bool> g_active{false};
std::mutex g_mu;
std::vector<Range> g_ranges;  // guarded by g_mu
thread_local std::string t_label;
const std::string kEmpty;

void add(std::string name, int64_t begin_ns, int64_t end_ns) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_active.load(std::memory_order_relaxed)) return;
  g_ranges.push_back({std::move(name), begin_ns, end_ns, this_thread_id()});
}
}  // namespace

bool active() { return g_active.load(std::memory_order_relaxed); }

void start() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ranges.clear();
  g_active.store(true);
}

std::vector<Range> stop() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_active.store(false);
  return std::move(g_ranges);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t this_thread_id() {
  thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  return tid;
}

Scope::Scope(const char* name) {
  if (!active()) return;
  name_ = name;
  begin_ns_ = now_ns();
}

Scope::Scope(std::string name) {
  if (!active()) return;
  name_ = std::move(name);
  begin_ns_ = now_ns();
}

Scope::~Scope() {
  if (begin_ns_ >= 0) add(std::move(name_), begin_ns_, now_ns());
}

Label::Label(std::string label) : previous_(std::move(t_label)) { t_label = std::move(label); }

Label::~Label() { t_label = std::move(previous_); }

const std::string& label() { return active() ? t_label : kEmpty; }

}  // namespace mllm::trace
