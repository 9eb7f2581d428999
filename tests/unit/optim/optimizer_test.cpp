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

TEST(Optimizer, FusedAdamWFollowsFloat64AdamWAndKeepsTheCheckpointFormat) {
  // Ten steps of the fused update against AdamW written out in float64 (Loshchilov & Hutter
  // 2019, algorithm 2 with PyTorch's placement of eps after the bias-corrected sqrt), then the
  // saved state loaded into LibTorch's own torch::optim::AdamW continues the same way.
  if (!mllm::optimizer_registry().contains("adamw")) mllm::register_builtin_optimizers();
  mllm::OptimConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.betas = {0.9, 0.95};
  cfg.eps = 1e-8;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, wd = 0.1, eps = 1e-8;
  auto ps = params();
  auto opt = mllm::optimizer_registry().create("adamw", cfg, ps);
  EXPECT_NE(dynamic_cast<mllm::FusedAdamW*>(opt.get()), nullptr);
  mllm::set_lr(*opt, lr);
  std::vector<torch::Tensor> p64, m64, v64;
  for (auto& p : ps) {
    p64.push_back(p.param.detach().to(torch::kDouble));
    m64.push_back(torch::zeros_like(p64.back()));
    v64.push_back(torch::zeros_like(p64.back()));
  }
  auto reference_step = [&](int step, const std::vector<torch::Tensor>& grads) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const double decay = i == 1 ? wd : 0.0;  // only fc1.weight is in the decay group
      const auto& g = grads[i];
      p64[i] = p64[i] * (1 - lr * decay);
      m64[i] = b1 * m64[i] + (1 - b1) * g;
      v64[i] = b2 * v64[i] + (1 - b2) * g * g;
      auto m_hat = m64[i] / (1 - std::pow(b1, step));
      auto v_hat = v64[i] / (1 - std::pow(b2, step));
      p64[i] = p64[i] - lr * m_hat / (v_hat.sqrt() + eps);
    }
  };
  torch::manual_seed(7);
  auto grads_for_step = [&] {
    std::vector<torch::Tensor> g;
    for (auto& p : ps) g.push_back(torch::randn(p.param.sizes(), torch::kDouble));
    return g;
  };
  for (int step = 1; step <= 10; ++step) {
    auto g = grads_for_step();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].param.mutable_grad() = g[i].to(torch::kFloat);
    opt->step();
    reference_step(step, g);
  }
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_LE((ps[i].param.detach().to(torch::kDouble) - p64[i]).abs().max().item<double>(), 1e-6)
        << ps[i].name;

  std::stringstream archive;
  torch::save(*opt, archive);
  std::vector<torch::Tensor> decay{ps[1].param}, no_decay{ps[0].param, ps[2].param, ps[3].param};
  auto options = [&](double w) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(lr);
    o->betas(std::make_tuple(b1, b2)).eps(eps).weight_decay(w);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(wd));
  groups.emplace_back(no_decay, options(0.0));
  torch::optim::AdamW plain(std::move(groups), torch::optim::AdamWOptions(lr));
  torch::load(plain, archive);
  // torch::optim::AdamW keys its state by parameter; the groups above list them in the same
  // order as the factory, so the loaded moments and step count line up.
  auto g = grads_for_step();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].param.mutable_grad() = g[i].to(torch::kFloat);
  plain.step();
  reference_step(11, g);
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_LE((ps[i].param.detach().to(torch::kDouble) - p64[i]).abs().max().item<double>(), 1e-6)
        << ps[i].name << " after loading into torch::optim::AdamW";
}
