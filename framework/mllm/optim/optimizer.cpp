// AdamW with decay / no-decay parameter groups, and the optimizer registry.
#include "mllm/optim/optimizer.h"

#include <map>

#include <ATen/ops/_fused_adamw.h>

#include "mllm/core/error.h"

namespace mllm {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  for (auto& group : param_groups())  // (the factory never sets amsgrad)
    if (static_cast<torch::optim::AdamWOptions&>(group.options()).amsgrad())
      return torch::optim::AdamW::step(closure);
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    // One float32 step tensor per (device, step) for the whole group: the kernel reads them.
    std::map<std::pair<std::string, int64_t>, torch::Tensor> step_tensors;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      MLLM_CHECK(!p.grad().is_sparse(), "adamw: sparse gradients are not supported");
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {  // as torch::optim::AdamW: zero moments, step 0
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      auto& t = step_tensors[{p.device().str(), st.step()}];
      if (!t.defined())
        t = torch::full({}, static_cast<double>(st.step()),
                        torch::TensorOptions().dtype(torch::kFloat).device(p.device()));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      steps.push_back(t);
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  return loss;
}

bool decays(const OptimConfig& cfg, const NamedParam& p) {
  if (p.is_embedding) return cfg.decay_embeddings;
  if (p.param.dim() < 2) return cfg.decay_bias_and_norm;
  return true;
}

std::shared_ptr<FusedAdamW> make_adamw(const OptimConfig& cfg, std::vector<torch::Tensor> decay,
                                       std::vector<torch::Tensor> no_decay) {
  auto options = [&](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(cfg.lr);
    o->betas(std::make_tuple(cfg.betas.at(0), cfg.betas.at(1))).eps(cfg.eps).weight_decay(wd);
    return o;
  };
  // Both groups always exist so that optimizer state keeps the same layout across runs.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(decay), options(cfg.weight_decay));
  groups.emplace_back(std::move(no_decay), options(0.0));
  return std::make_shared<FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(cfg.lr));
}

std::pair<std::vector<std::string>, std::vector<std::string>> weight_decay_split(
    const OptimConfig& cfg, const std::vector<NamedParam>& params) {
  std::vector<std::string> decay, no_decay;
  for (const auto& p : params) (decays(cfg, p) ? decay : no_decay).push_back(p.name);
  return {decay, no_decay};
}

OptimizerRegistry& optimizer_registry() {
  static OptimizerRegistry registry("optimizer");
  return registry;
}

void register_builtin_optimizers() {
  optimizer_registry().add("adamw", [](const OptimConfig& cfg,
                                       const std::vector<NamedParam>& params) {
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& p : params) (decays(cfg, p) ? decay : no_decay).push_back(p.param);
    return make_adamw(cfg, std::move(decay), std::move(no_decay));
  });
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) {
    auto& o = group.options();
    if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) a->lr(lr);
    else if (auto* b = dynamic_cast<torch::optim::AdamOptions*>(&o)) b->lr(lr);
    else if (auto* c = dynamic_cast<torch::optim::SGDOptions*>(&o)) c->lr(lr);
    else throw Error("set_lr: unsupported optimizer options type; extend mllm::set_lr");
  }
}

bool apply_optimizer_hyperparams(torch::optim::Optimizer& opt, const OptimConfig& cfg) {
  auto& groups = opt.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&groups[g].options());
    if (a == nullptr) return false;
    a->betas(std::make_tuple(cfg.betas.at(0), cfg.betas.at(1)))
        .eps(cfg.eps)
        .weight_decay(g == 0 ? cfg.weight_decay : 0.0);
  }
  return true;
}

}  // namespace mllm
