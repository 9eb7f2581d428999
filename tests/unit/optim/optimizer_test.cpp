// AdamW parameter groups: which parameters decay, and one step against AdamW's closed form.
#include <cmath>
#include <sstream>

#include <gtest/gtest.h>

#include "mllm/optim/optimizer.h"

namespace {
std::vector<mllm::NamedParam> params() {
  return {{"tok_emb.weight", torch::ones({4, 3}, torch::requires_grad()), true},
          {"layers.0.fc1.weight", torch::ones({3, 3}, torch::requires_grad()), false},
          {"layers.0.fc1.bias", torch::ones({3}, torch::requires_grad()), false},
          {"layers.0.norm1.weight", torch::ones({3}, torch::requires_grad()), false}};
}
}  // namespace

TEST(Optimizer, DefaultGroupsSkipBiasNormAndEmbeddings) {
  mllm::OptimConfig cfg;
  auto [decay, no_decay] = mllm::weight_decay_split(cfg, params());
  EXPECT_EQ(decay, std::vector<std::string>{"layers.0.fc1.weight"});
  EXPECT_EQ(no_decay, (std::vector<std::string>{"tok_emb.weight", "layers.0.fc1.bias",
                                                "layers.0.norm1.weight"}));
  cfg.decay_embeddings = true;
  cfg.decay_bias_and_norm = true;
  EXPECT_EQ(mllm::weight_decay_split(cfg, params()).first.size(), 4u);
}

TEST(Optimizer, AdamWStepMatchesClosedForm) {
  if (!mllm::optimizer_registry().contains("adamw")) mllm::register_builtin_optimizers();
  mllm::OptimConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.5;
  cfg.betas = {0.9, 0.95};
  cfg.eps = 1e-8;
  auto ps = params();
  auto opt = mllm::optimizer_registry().create("adamw", cfg, ps);
  mllm::set_lr(*opt, 0.01);  // the schedule's value wins over optim.lr
  for (auto& p : ps) p.param.mutable_grad() = torch::full_like(p.param, 2.0);
  opt->step();
  // First AdamW step: m = 0.1 g, v = 0.05 g^2; bias-corrected m_hat = g, v_hat = g^2, so the
  // update is lr * g / (|g| + eps) = lr (for g = 2), after decoupled decay p *= (1 - lr * wd).
  const double lr = 0.01, upd = lr * 2.0 / (2.0 + 1e-8);
  EXPECT_NEAR(ps[1].param[0][0].item<double>(), 1.0 * (1 - lr * 0.5) - upd, 1e-7);  // decays
  EXPECT_NEAR(ps[2].param[0].item<double>(), 1.0 - upd, 1e-7);                      // bias: no decay
  EXPECT_NEAR(ps[0].param[0][0].item<double>(), 1.0 - upd, 1e-7);                   // embedding
}

TEST(Optimizer, ResumedOptimizerUsesTheRecipesHyperparameters) {
  // Saved with weight decay 0 and betas (0.5, 0.5); resumed with the recipe's wd 0.5 and betas
  // (0.9, 0.95): the checkpoint's options must not win (a "rewind and change" resume).
  if (!mllm::optimizer_registry().contains("adamw")) mllm::register_builtin_optimizers();
  mllm::OptimConfig old_cfg;
  old_cfg.weight_decay = 0.0;
  old_cfg.betas = {0.5, 0.5};
  auto saved_ps = params();
  auto saved = mllm::optimizer_registry().create("adamw", old_cfg, saved_ps);
  std::stringstream archive;
  torch::save(*saved, archive);

  mllm::OptimConfig cfg;
  cfg.weight_decay = 0.5;
  cfg.betas = {0.9, 0.95};
  auto ps = params();
  auto opt = mllm::optimizer_registry().create("adamw", cfg, ps);
  torch::load(*opt, archive);
  EXPECT_TRUE(mllm::apply_optimizer_hyperparams(*opt, cfg));
  mllm::set_lr(*opt, 0.01);
  for (auto& p : ps) p.param.mutable_grad() = torch::full_like(p.param, 2.0);
  opt->step();
  // The first step's closed form (see AdamWStepMatchesClosedForm) with wd 0.5: bias correction
  // makes the update independent of the betas, the decay shows the recipe's weight decay.
  const double lr = 0.01, upd = lr * 2.0 / (2.0 + 1e-8);
  EXPECT_NEAR(ps[1].param[0][0].item<double>(), 1.0 * (1 - lr * 0.5) - upd, 1e-7);
  EXPECT_NEAR(ps[2].param[0].item<double>(), 1.0 - upd, 1e-7);  // no-decay group stays at 0
  // Second step with g = 0: m = 0.9 * 0.1 g = 0.18, v = 0.95 * 0.05 g^2 = 0.19 (beta2 = 0.95);
  // m_hat = 0.18 / (1 - 0.81) , v_hat = 0.19 / (1 - 0.9025).
  const double p1 = ps[2].param[0].item<double>();
  for (auto& p : ps) p.param.mutable_grad() = torch::zeros_like(p.param);
  opt->step();
  const double m_hat = 0.18 / (1 - 0.81), v_hat = 0.19 / (1 - 0.9025);
  EXPECT_NEAR(ps[2].param[0].item<double>(), p1 - lr * m_hat / (std::sqrt(v_hat) + 1e-8), 1e-7);
}
