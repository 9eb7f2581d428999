// Learning-rate schedules, chosen by `schedule.type`: warmup_cosine, constant, linear.
// Stepped once per optimizer step. lr(step) is a pure function of the 0-based step about to be
// taken, so resume and any world size give the same trace.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"

namespace mllm {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // Learning rate for 0-based optimizer step `step` (0 <= step; steps past max_steps hold the
  // final value). Unitless multiplier already applied: returns the lr itself.
  virtual double lr(int64_t step) const = 0;
};

// Factory signature: (schedule section, peak lr = optim.lr, max_steps = train.max_steps).
using LrScheduleRegistry =
    Registry<LrSchedule, const ScheduleConfig&, double /*peak_lr*/, int64_t /*max_steps*/>;
LrScheduleRegistry& lr_schedule_registry();

// Registers warmup_cosine, constant, linear.
void register_builtin_lr_schedules();

// warmup_cosine (nanoGPT / llm.c convention):
//   step >= T:           min_lr
//   step < W:            lr * (step + 1) / W                    (linear warmup, reaches lr at W-1)
//   W <= step < T:       min_lr + 0.5 (lr - min_lr) (1 + cos(pi (step - W) / (T - W)))
// with W = warmup_steps, T = max_steps. Endpoints: lr(0) = lr / W (lr when W = 0), lr(T) = min_lr
// exactly. W >= T is allowed: the lr then ramps for the whole run, reaching lr * T / W at the
// last step T-1 (lr when W = T). Loshchilov & Hutter 2017 (SGDR).
class WarmupCosineSchedule : public LrSchedule {
 public:
  WarmupCosineSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t max_steps);
  double lr(int64_t step) const override;

 private:
  double peak_lr_, min_lr_;
  int64_t warmup_steps_, max_steps_;
};

// constant: warmup as above (any W >= 0), then lr forever; lr(0) = lr / W (lr when W = 0).
class ConstantSchedule : public LrSchedule {
 public:
  ConstantSchedule(double peak_lr, int64_t warmup_steps);
  double lr(int64_t step) const override;

 private:
  double peak_lr_;
  int64_t warmup_steps_;
};

// linear: warmup as above, then a straight line from lr at W to min_lr at T; lr(T) = min_lr
// exactly, and W >= T ramps for the whole run as in warmup_cosine.
class LinearSchedule : public LrSchedule {
 public:
  LinearSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t max_steps);
  double lr(int64_t step) const override;

 private:
  double peak_lr_, min_lr_;
  int64_t warmup_steps_, max_steps_;
};

}  // namespace mllm
