// A plugin as a user would write one: registers an lr schedule named "plugin_half" (always lr/2).
#include "mllm/optim/lr_schedule.h"

namespace {
class HalfSchedule : public mllm::LrSchedule {
 public:
  explicit HalfSchedule(double lr) : lr_(lr) {}
  double lr(int64_t) const override { return lr_ / 2; }

 private:
  double lr_;
};
}  // namespace

extern "C" void mllm_register_plugin() {
  mllm::lr_schedule_registry().add(
      "plugin_half", [](const mllm::ScheduleConfig&, double lr, int64_t) {
        return std::make_shared<HalfSchedule>(lr);
      });
}
