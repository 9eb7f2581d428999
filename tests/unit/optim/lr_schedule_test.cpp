// Learning-rate schedules against their closed forms, computed here independently.
#include <cmath>

#include <gtest/gtest.h>

#include "mllm/optim/lr_schedule.h"

TEST(LrSchedule, WarmupCosineClosedForm) {
  // warmup 10, cosine to step 100, lr 1e-3, min_lr 1e-4 (issue 6).
  mllm::WarmupCosineSchedule s(1e-3, 1e-4, 10, 100);
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-4);      // 1e-3 * 1/10
  EXPECT_DOUBLE_EQ(s.lr(4), 5e-4);      // 1e-3 * 5/10
  EXPECT_DOUBLE_EQ(s.lr(9), 1e-3);      // warmup reaches the peak on its last step
  EXPECT_DOUBLE_EQ(s.lr(10), 1e-3);     // cosine starts at the peak
  EXPECT_NEAR(s.lr(55), 5.5e-4, 1e-15); // half way: (1e-3 + 1e-4) / 2
  // step 32: progress 22/90; 1e-4 + 0.5 * 9e-4 * (1 + cos(pi * 22/90))
  EXPECT_NEAR(s.lr(32), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * 22.0 / 90.0)), 1e-18);
  EXPECT_EQ(s.lr(100), 1e-4);
  EXPECT_EQ(s.lr(150), 1e-4);
}

TEST(LrSchedule, ConstantAndLinear) {
  mllm::ConstantSchedule c(2e-3, 4);
  EXPECT_DOUBLE_EQ(c.lr(1), 1e-3);
  EXPECT_DOUBLE_EQ(c.lr(4), 2e-3);
  EXPECT_DOUBLE_EQ(c.lr(1000), 2e-3);
  mllm::LinearSchedule l(1e-3, 0.0, 0, 100);
  EXPECT_DOUBLE_EQ(l.lr(0), 1e-3);
  EXPECT_DOUBLE_EQ(l.lr(25), 7.5e-4);
  EXPECT_DOUBLE_EQ(l.lr(100), 0.0);
}

// Warmup 0, warmup == max_steps and warmup > max_steps, for every schedule; values by hand.
TEST(LrSchedule, WarmupEdgeCasesAndExactEndpoints) {
  mllm::WarmupCosineSchedule w0(1e-3, 1e-4, 0, 100);
  EXPECT_DOUBLE_EQ(w0.lr(0), 1e-3);              // no warmup: the cosine starts at the peak
  EXPECT_NEAR(w0.lr(50), 5.5e-4, 1e-15);         // cos(pi/2) = 0: (1e-3 + 1e-4) / 2
  EXPECT_EQ(w0.lr(100), 1e-4);
  mllm::WarmupCosineSchedule weq(1e-3, 1e-4, 10, 10);
  EXPECT_DOUBLE_EQ(weq.lr(0), 1e-4);             // 1e-3 * 1/10
  EXPECT_DOUBLE_EQ(weq.lr(9), 1e-3);             // the last step reaches the peak
  EXPECT_EQ(weq.lr(10), 1e-4);                   // lr(T) = min_lr exactly
  mllm::WarmupCosineSchedule wgt(1e-3, 1e-4, 20, 10);
  EXPECT_DOUBLE_EQ(wgt.lr(9), 5e-4);             // 1e-3 * 10/20: ramps for the whole run
  EXPECT_EQ(wgt.lr(10), 1e-4);
  mllm::LinearSchedule leq(1e-3, 0.0, 10, 10);
  EXPECT_DOUBLE_EQ(leq.lr(9), 1e-3);
  EXPECT_EQ(leq.lr(10), 0.0);
  mllm::LinearSchedule lgt(1e-3, 0.0, 40, 10);
  EXPECT_DOUBLE_EQ(lgt.lr(3), 1e-4);             // 1e-3 * 4/40
  EXPECT_EQ(lgt.lr(10), 0.0);
  mllm::ConstantSchedule c0(2e-3, 0);
  EXPECT_DOUBLE_EQ(c0.lr(0), 2e-3);
  mllm::ConstantSchedule cgt(2e-3, 8);
  EXPECT_DOUBLE_EQ(cgt.lr(3), 1e-3);             // 2e-3 * 4/8
}

TEST(LrSchedule, RegistryBuildsFromRecipe) {
  auto& reg = mllm::lr_schedule_registry();
  if (!reg.contains("warmup_cosine")) mllm::register_builtin_lr_schedules();
  mllm::ScheduleConfig cfg;
  cfg.warmup_steps = 10;
  cfg.min_lr = 1e-4;
  auto s = reg.create("warmup_cosine", cfg, 1e-3, 100);
  EXPECT_DOUBLE_EQ(s->lr(4), 5e-4);
  EXPECT_EQ(s->lr(100), 1e-4);
}
