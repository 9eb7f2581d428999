// Named ranges for profiler traces (recipe `profile.steps`, train/profiler.h): forward, backward,
// each bucket's collectives, optimizer, data loading, checkpoint. While a trace is recorded they
// are collected with their thread and wall-clock times and merged into LibTorch's Chrome trace;
// otherwise a range costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mllm::trace {

struct Range {
  std::string name;
  int64_t begin_ns = 0, end_ns = 0;  // system_clock, ns since the Unix epoch (Kineto's clock)
  int64_t tid = 0;                   // the OS thread id (gettid), as Kineto's "tid"
};

// True between start() and stop().
bool active();
// Starts collecting ranges (dropping any left over). Thread-safe.
void start();
// Stops collecting; returns the ranges collected since start(), in completion order.
std::vector<Range> stop();
// ns since the Unix epoch, system_clock.
int64_t now_ns();
// The calling thread's OS thread id.
int64_t this_thread_id();

// Records [construction, destruction) under `name` on the calling thread, when active() at
// construction. Nesting is fine (Perfetto stacks them).
class Scope {
 public:
  explicit Scope(const char* name);
  explicit Scope(std::string name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string name_;
  int64_t begin_ns_ = -1;  // -1: not recording
};

// Names the collectives this thread issues while it lives (DataParallel: "bucket 3
// reduce-scatter"): the communicator runs each one inside a Scope named label() on its own thread.
class Label {
 public:
  explicit Label(std::string label);
  ~Label();
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  std::string previous_;
};
// The innermost Label of the calling thread, or "" when none (or when not active()).
const std::string& label();

}  // namespace mllm::trace
