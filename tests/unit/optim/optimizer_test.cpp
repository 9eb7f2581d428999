// AdamW parameter groups: which parameters decay, and one step against AdamW's closed form.
#include <cmath>

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
