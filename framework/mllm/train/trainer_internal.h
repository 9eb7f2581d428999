// The trainer's parts share these (trainer.cpp, trainer_build.cpp, trainer_resume.cpp,
// train_step.cpp, trainer_eval.cpp): timing, bf16 autocast scopes, batches on the device, and
// metrics.jsonl's rewind on resume. Not installed for plugins' use: internal to train/.
#pragma once

#include <chrono>
#include <string>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "mllm/data/dataset.h"

namespace mllm::detail {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// bf16 autocast on `device`'s type for the scope; restores the previous autocast state on exit
// and clears autocast's cache of bf16 weight casts, unless `keep_cache` (the training step keeps
// it for all its micro-batches and clears it with AutocastCacheClearedAtExit).
class Autocast {
 public:
  Autocast(bool enabled, const torch::Device& device, bool keep_cache = false)
      : enabled_(enabled), keep_cache_(keep_cache), type_(device.type()) {
    if (!enabled_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~Autocast() {
    if (!enabled_) return;
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
    if (!keep_cache_) at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_;
  bool keep_cache_;
  at::DeviceType type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

inline // The batch on `device`: pinned host memory and a non-blocking copy for a GPU.
Batch to_device(Batch b, const torch::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.pin_memory().to(device, /*non_blocking=*/true);
  b.targets = b.targets.pin_memory().to(device, /*non_blocking=*/true);
  return b;
}

// Rewrites metrics.jsonl without the lines whose "step" is greater than `step` (and without a
// line torn by a crash). The new file is written beside the old one, read back and compared
// before it replaces it, so a full disk can never cost the lines that were already there.
void drop_metrics_after(const std::string& path, int64_t step);

}  // namespace mllm::detail
