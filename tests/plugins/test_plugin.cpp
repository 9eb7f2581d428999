// A plugin as a user would write one: registers an lr schedule named "plugin_half" (lr x factor,
// factor an option declared by the plugin, default 0.5) and a callback "plugin_counter" with a
// top-level options section of its own.
#include "mllm/core/options.h"
#include "mllm/core/plugin.h"
#include "mllm/optim/lr_schedule.h"
#include "mllm/train/callback.h"

MLLM_PLUGIN_STAMP();

namespace {
class HalfSchedule : public mllm::LrSchedule {
 public:
  HalfSchedule(double lr, double factor) : lr_(lr), factor_(factor) {}
  double lr(int64_t) const override { return lr_ * factor_; }

 private:
  double lr_, factor_;
};

class CounterCallback : public mllm::Callback {};
}  // namespace

extern "C" void mllm_register_plugin() {
  mllm::lr_schedule_registry().add(
      "plugin_half", [](const mllm::ScheduleConfig& c, double lr, int64_t) {
        return std::make_shared<HalfSchedule>(lr, c.options.number("factor"));
      });
  mllm::register_options("schedule", "plugin_half",
                         mllm::OptionSchema().number("factor", 0.5, "lr multiplier",
                                                     {0.0, 1.0, true, false}));
  mllm::callback_registry().add("plugin_counter", [](const mllm::Recipe&) {
    return std::make_shared<CounterCallback>();
  });
  mllm::register_options("callback", "plugin_counter",
                         mllm::OptionSchema()
                             .integer("every", 10, "count every N steps",
                                      mllm::OptionRange::at_least(1))
                             .string("mode", "steps", "what to count", {"steps", "tokens"})
                             .boolean("verbose", false, "log each count")
                             .strings("tags", {"a"}, "labels"));
}
