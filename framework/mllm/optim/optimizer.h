// Optimizer factory by `optim.type` (adamw) with parameter groups: by default no weight decay
// for biases, norm weights (any 1-D parameter) and embedding tables, as in nanoGPT / GPT-2.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"

namespace mllm {

// A named parameter and whether it is an embedding table (decides its weight-decay group).
struct NamedParam {
  std::string name;
  torch::Tensor param;
  bool is_embedding = false;
};

// Splits parameters into [decayed, not decayed] following `cfg`: 1-D tensors (biases, norm
// weights) decay only with decay_bias_and_norm, embeddings only with decay_embeddings.
// Returns the two name lists in parameter order (for logging and tests).
std::pair<std::vector<std::string>, std::vector<std::string>> weight_decay_split(
    const OptimConfig& cfg, const std::vector<NamedParam>& params);

// torch::optim::AdamW (Loshchilov & Hutter 2019, decoupled weight decay; the same options,
// state and checkpoint format) whose step() updates each parameter group with one call of
// ATen's fused multi-tensor kernel (at::_fused_adamw_, the kernel behind PyTorch's
// AdamW(fused=True)): one pass over each parameter, gradient and both moments, instead of
// torch::optim::AdamW's eight tensor ops per parameter. Same arithmetic up to float32
// rounding. amsgrad falls back to the per-tensor step. Throws mllm::Error on a sparse gradient.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// FusedAdamW with the "adamw" factory's two groups: `decay` with cfg.weight_decay, `no_decay`
// with none (both groups always exist), lr cfg.lr, cfg.betas, cfg.eps. For tensors that are not
// the model's parameters (ZeRO stage 1's shard segments, whose group follows their parameter).
std::shared_ptr<FusedAdamW> make_adamw(const OptimConfig& cfg, std::vector<torch::Tensor> decay,
                                       std::vector<torch::Tensor> no_decay);

// True when `p` decays under `cfg` (weight_decay_split's rule).
bool decays(const OptimConfig& cfg, const NamedParam& p);

// Factory: (optim section, parameters) -> optimizer with two groups (decay, no decay), lr set
// to optim.lr (the schedule overwrites it every step via set_lr()).
using OptimizerRegistry =
    Registry<torch::optim::Optimizer, const OptimConfig&, const std::vector<NamedParam>&>;
OptimizerRegistry& optimizer_registry();

// Registers "adamw" (FusedAdamW).
void register_builtin_optimizers();

// Sets the learning rate of every parameter group. Throws mllm::Error for an optimizer whose
// options type has no lr this function knows (AdamW, Adam, SGD are known).
void set_lr(torch::optim::Optimizer& opt, double lr);

// Sets the recipe's betas, eps and weight decay on an optimizer built by the "adamw" factory
// (group 0 decays with cfg.weight_decay, group 1 never), whatever a loaded checkpoint held —
// so a resumed run uses the hyperparameters of its recipe ("rewind and change the
// hyperparameters"). The lr is set every step by set_lr. Optimizers of other option types are
// left as they are (returns false), else returns true.
bool apply_optimizer_hyperparams(torch::optim::Optimizer& opt, const OptimConfig& cfg);

}  // namespace mllm
