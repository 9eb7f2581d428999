// profile.steps: LibTorch's profiler plus mllm's named ranges into RUN/profile/rank_NN.json.
#include "mllm/train/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "mllm/core/error.h"
#include "mllm/data/atomic_file.h"
#include "mllm/train/trainer.h"

namespace mllm {
namespace {

using torch::profiler::impl::ActivityType;

std::set<ActivityType> activities(const torch::Device& device) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (device.is_cuda()) a.insert(ActivityType::CUDA);
  return a;
}

class ProfilerCallback : public Callback {
 public:
  explicit ProfilerCallback(const Recipe& r)
      : first_(r.profile.steps.at(0)), last_(r.profile.steps.at(1)),
        record_shapes_(r.profile.record_shapes) {}

  void on_train_begin(Trainer& t) override {
    const int64_t max_steps = t.recipe().train.max_steps;
    if (first_ > max_steps)
      spdlog::warn("profile.steps=[{}, {}] begins after train.max_steps={}: nothing will be "
                   "traced", first_, last_, max_steps);
    else if (t.step() >= last_)
      spdlog::warn("profile.steps=[{}, {}]: this run resumes at step {}, after the window; "
                   "nothing is traced in this invocation (a trace an earlier one wrote is kept)",
                   first_, last_, t.step());
    else if (last_ > max_steps)
      spdlog::warn("profile.steps=[{}, {}] ends after train.max_steps={}: the trace stops at "
                   "step {}", first_, last_, max_steps, max_steps);
    if (t.step() + 1 >= first_ && t.step() + 1 <= last_) start(t);
  }
  // ZeRO stages 1-3 start the next forward's parameter all-gathers right after the update: to
  // hold them, the window opens there, before step first's own range (stage 0 has none).
  void on_optimizer_step_end(Trainer& t, int64_t step) override {
    if (step == first_ - 1 && t.recipe().dist.zero_stage >= 1 && !recording_) start(t);
  }
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    if (m.step == last_ && recording_) finish(t);
    else if (m.step == first_ - 1 && !recording_) start(t);
  }
  void on_train_end(Trainer& t, StopReason) override {
    if (recording_) finish(t);
  }

 private:
  void start(Trainer& t) {
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                       /*report_input_shapes=*/record_shapes_);
    torch::autograd::profiler::prepareProfiler(config, activities(t.device()));
    torch::autograd::profiler::enableProfiler(config, activities(t.device()));
    trace::start();
    recording_ = true;
    begin_step_ = std::max<int64_t>(first_, t.step() + 1);
    spdlog::info("profile.steps: recording steps {}..{} (LibTorch profiler + named ranges)",
                 begin_step_, last_);
  }

  void finish(Trainer& t) {
    recording_ = false;
    const std::vector<trace::Range> ranges = trace::stop();
    const auto result = torch::autograd::profiler::disableProfiler();
    const std::string dir = t.run_dir() + "/profile";
    std::string path = fmt::format("{}/rank_{:02d}.json", dir, t.comm().rank());
    // An earlier invocation's trace (a resume inside or after the window, another window) is
    // kept: this one is named by its steps.
    if (std::filesystem::exists(path))
      path = fmt::format("{}/rank_{:02d}.steps_{}-{}.json", dir, t.comm().rank(), begin_step_,
                         t.step());
    std::filesystem::create_directories(dir);
    const std::string kineto = path + ".kineto.tmp";
    result->save(kineto);
    std::string text;
    try {
      text = merge_trace_ranges(read_file_bytes(kineto), ranges, static_cast<int64_t>(::getpid()));
    } catch (const std::exception& e) {
      std::error_code ec;
      std::filesystem::remove(kineto, ec);
      throw Error(fmt::format("profile.steps: cannot read LibTorch's trace {}: {}", kineto, e.what()));
    }
    std::error_code ec;
    std::filesystem::remove(kineto, ec);
    write_file_atomic(path, text);
    spdlog::info("profile.steps: steps {}..{} traced into {} ({} named ranges; open it in "
                 "ui.perfetto.dev)", begin_step_, t.step(), path, ranges.size());
  }

  int64_t first_, last_;
  bool record_shapes_;
  int64_t begin_step_ = 0;
  bool recording_ = false;
};

}  // namespace

std::string merge_trace_ranges(const std::string& kineto_trace,
                               const std::vector<trace::Range>& ranges, int64_t pid) {
  nlohmann::json j = nlohmann::json::parse(kineto_trace);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    throw Error("not a Chrome trace object (no traceEvents array)");
  const int64_t base_ns = j.value("baseTimeNanoseconds", int64_t{0});
  auto& events = j["traceEvents"];
  std::set<int64_t> threads;
  for (const auto& e : events)
    if (e.contains("tid") && e["tid"].is_number_integer()) threads.insert(e["tid"].get<int64_t>());
  for (const auto& r : ranges) {
    events.push_back({{"ph", "X"},
                      {"cat", "mllm"},
                      {"name", r.name},
                      {"pid", pid},
                      {"tid", r.tid},
                      {"ts", static_cast<double>(r.begin_ns - base_ns) / 1000.0},
                      {"dur", static_cast<double>(r.end_ns - r.begin_ns) / 1000.0}});
    // A thread Kineto saw nothing on (the communication thread): name it.
    if (threads.insert(r.tid).second && r.tid != pid)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", r.tid},
                        {"args", {{"name", "mllm communication"}}}});
  }
  return j.dump() + "\n";
}

std::shared_ptr<Callback> make_profiler_callback(const Recipe& recipe) {
  return std::make_shared<ProfilerCallback>(recipe);
}

}  // namespace mllm
