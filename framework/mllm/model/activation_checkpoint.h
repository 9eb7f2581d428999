// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
// PyTorch's torch.utils.checkpoint, reentrant variant): a checkpointed function keeps only its
// input during forward and runs again under grad mode in backward, so the activations inside it
// live only while its own backward runs. LibTorch's C++ API has no torch.utils.checkpoint; this
// is a custom autograd function that does the same.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

namespace mllm {

// y = fn(x), differentiable in x and in every tensor fn reads that requires grad (a module's
// parameters): backward recomputes fn(x) under grad mode and runs backward through the
// recomputation, which accumulates into the parameters' .grad (their gradient-accumulator hooks
// fire as in a plain backward) and returns x's gradient.
//   x: any shape and floating dtype, requiring grad (an x that does not is run plainly: there is
//      nothing to recompute for); fn: a pure function of x and its module's state, returning
//      one tensor. Tensors fn captures (masks, rotary tables) are read again in backward and must
//      not change in between.
// The recomputation sees what the forward saw: the default CPU generator (and the CUDA one when
// x is on a GPU) is rewound to its state at the forward, so dropout draws the same masks, then
// restored; autocast (enabled, dtype) for x's device type is as at the forward. So gradients
// equal a plain backward's bitwise on the CPU (same kernels, same order).
// Backward must run once (a second backward through the same graph throws mllm::Error).
torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& x);

// model.activation_checkpointing: which blocks a model checkpoints.
//   mode "none": none; "full": every block; "every_n": blocks 0, n, 2n, ... (every > 0).
// Throws mllm::ConfigError for another mode or every_n with every < 1.
struct ActivationCheckpointing {
  std::string mode = "none";
  int64_t every = 1;
  ActivationCheckpointing() = default;
  ActivationCheckpointing(std::string mode, int64_t every);
  // True when block `layer` (0-based) is checkpointed.
  bool applies_to(int64_t layer) const;
  // Blocks checkpointed out of `n_layers`.
  int64_t count(int64_t n_layers) const;
};

}  // namespace mllm
