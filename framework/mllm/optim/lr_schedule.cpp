// Warmup + cosine / constant / linear learning-rate schedules and their registry.
#include "mllm/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mllm {
namespace {
// Linear warmup from 0: the first step already moves (lr * 1/W), step W-1 reaches lr.
double warmup(double peak, int64_t step, int64_t warmup_steps) {
  return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
}
// Fraction of the decay phase done at `step` (W <= step < T): (step - W) / (T - W).
double decay_progress(int64_t step, int64_t warmup_steps, int64_t max_steps) {
  return static_cast<double>(step - warmup_steps) /
         static_cast<double>(std::max<int64_t>(1, max_steps - warmup_steps));
}
}  // namespace

WarmupCosineSchedule::WarmupCosineSchedule(double peak_lr, double min_lr, int64_t warmup_steps,
                                           int64_t max_steps)
    : peak_lr_(peak_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), max_steps_(max_steps) {}

double WarmupCosineSchedule::lr(int64_t step) const {
  if (step >= max_steps_) return min_lr_;  // first: also when warmup_steps >= max_steps
  if (step < warmup_steps_) return warmup(peak_lr_, step, warmup_steps_);
  const double progress = decay_progress(step, warmup_steps_, max_steps_);
  return min_lr_ + 0.5 * (peak_lr_ - min_lr_) * (1.0 + std::cos(M_PI * progress));
}

ConstantSchedule::ConstantSchedule(double peak_lr, int64_t warmup_steps)
    : peak_lr_(peak_lr), warmup_steps_(warmup_steps) {}

double ConstantSchedule::lr(int64_t step) const {
  return step < warmup_steps_ ? warmup(peak_lr_, step, warmup_steps_) : peak_lr_;
}

LinearSchedule::LinearSchedule(double peak_lr, double min_lr, int64_t warmup_steps,
                               int64_t max_steps)
    : peak_lr_(peak_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), max_steps_(max_steps) {}

double LinearSchedule::lr(int64_t step) const {
  if (step >= max_steps_) return min_lr_;  // first: also when warmup_steps >= max_steps
  if (step < warmup_steps_) return warmup(peak_lr_, step, warmup_steps_);
  return peak_lr_ + (min_lr_ - peak_lr_) * decay_progress(step, warmup_steps_, max_steps_);
}

LrScheduleRegistry& lr_schedule_registry() {
  static LrScheduleRegistry registry("lr schedule");
  return registry;
}

void register_builtin_lr_schedules() {
  auto& r = lr_schedule_registry();
  r.add("warmup_cosine", [](const ScheduleConfig& c, double lr, int64_t max_steps) {
    return std::make_shared<WarmupCosineSchedule>(lr, c.min_lr, c.warmup_steps, max_steps);
  });
  r.add("constant", [](const ScheduleConfig& c, double lr, int64_t) {
    return std::make_shared<ConstantSchedule>(lr, c.warmup_steps);
  });
  r.add("linear", [](const ScheduleConfig& c, double lr, int64_t max_steps) {
    return std::make_shared<LinearSchedule>(lr, c.min_lr, c.warmup_steps, max_steps);
  });
}

}  // namespace mllm
