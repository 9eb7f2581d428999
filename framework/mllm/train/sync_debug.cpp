// train.sync_debug: LibTorch's CUDA sync debug mode, its warnings counted per call stack.
#include "mllm/train/sync_debug.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include <c10/util/Backtrace.h>

#if MLLM_TORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace mllm {

bool is_sync_debug_warning(const std::string& message) {
  // c10/cuda/CUDAFunctions.h warn_or_error_on_sync()
  return message.find("called a synchronizing CUDA operation") != std::string::npos;
}

std::vector<std::string> clean_backtrace(const std::string& backtrace) {
  // c10's format: "frame #3: symbol + 0x1f (0x7f00... in /path/libtorch_cpu.so)".
  // The offset stays (it tells two call sites in one function, or in a library without symbols,
  // apart, and is the same in every process of a build); the absolute address goes (ASLR).
  static const std::regex frame(R"(^frame #\d+: (.*?)( \+ 0x[0-9a-f]+)? \(0x[0-9a-f]+ in (.*)\)\s*$)");
  std::vector<std::string> frames;
  std::istringstream in(backtrace);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, frame)) continue;
    std::string lib = m[3].str();
    if (const auto slash = lib.rfind('/'); slash != std::string::npos) lib = lib.substr(slash + 1);
    frames.push_back(m[1].str() + m[2].str() + " (in " + lib + ")");
  }
  // Drop the warning machinery itself: everything up to the last frame of c10's warning code,
  // and our own handler.
  size_t first = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const std::string& f = frames[i];
    if (f.find("c10::warn") != std::string::npos || f.find("c10::Warning") != std::string::npos ||
        f.find("WarningHandler") != std::string::npos || f.find("mllm::SyncDebug") != std::string::npos ||
        f.find("c10::get_backtrace") != std::string::npos ||
        f.find("warn_or_error_on_sync") != std::string::npos)  // c10/cuda/CUDAFunctions.h
      first = i + 1;
  }
  return {frames.begin() + static_cast<std::ptrdiff_t>(std::min(first, frames.size())), frames.end()};
}

SyncDebug::~SyncDebug() { stop(); }

bool SyncDebug::start(bool cuda) {
#if MLLM_TORCH_HAS_CUDA
  if (cuda) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
#else
  if (cuda) return false;
#endif
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) {
    previous_ = c10::WarningUtils::get_warning_handler();
    c10::WarningUtils::set_warning_handler(this);
    active_ = true;
  }
  cuda_ = cuda;
  return true;
}

void SyncDebug::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
#if MLLM_TORCH_HAS_CUDA
  if (cuda_) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#endif
  if (c10::WarningUtils::get_warning_handler() == this) c10::WarningUtils::set_warning_handler(previous_);
  active_ = false;
}

void SyncDebug::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
}

void SyncDebug::process(const c10::Warning& warning) {
  if (!is_sync_debug_warning(warning.msg())) {
    if (previous_ != nullptr) previous_->process(warning);
    return;
  }
  SyncSite site;
  site.stack = clean_backtrace(c10::get_backtrace(/*frames_to_skip=*/0, /*max_frames=*/40));
  for (const auto& f : site.stack) {
    if (site.mllm_frame.empty() && f.rfind("mllm::", 0) == 0) site.mllm_frame = f;
    if (site.op_frame.empty() && (f.rfind("at::", 0) == 0 || f.rfind("c10::cuda::", 0) == 0))
      site.op_frame = f;
  }
  std::lock_guard<std::mutex> lock(mu_);
  site.phase = phase_;
  for (auto& s : sites_) {
    if (s.phase == site.phase && s.stack == site.stack) {
      ++s.count;
      return;
    }
  }
  site.count = 1;
  sites_.push_back(std::move(site));
}

std::vector<SyncSite> SyncDebug::sites() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SyncSite> out = sites_;
  std::stable_sort(out.begin(), out.end(),
                   [](const SyncSite& a, const SyncSite& b) { return a.count > b.count; });
  return out;
}

nlohmann::json SyncDebug::report(int64_t steps) const {
  const auto all = sites();
  nlohmann::json sites = nlohmann::json::array();
  int64_t total = 0;
  const double per = steps > 0 ? 1.0 / static_cast<double>(steps) : 0.0;
  for (const auto& s : all) {
    total += s.count;
    sites.push_back({{"phase", s.phase}, {"mllm_frame", s.mllm_frame}, {"op_frame", s.op_frame},
                     {"count", s.count}, {"per_step", static_cast<double>(s.count) * per},
                     {"stack", s.stack}});
  }
  return {{"steps", steps}, {"total", total}, {"per_step", static_cast<double>(total) * per},
          {"sites", sites}};
}

}  // namespace mllm
