// The post-LN residual step of minillm's blocks with the block's own modules:
// norm(x + drop(sublayer(x))), through the op of kernels/norm.h.
#pragma once

#include <torch/torch.h>

#include "mllm/kernels/norm.h"
#include "mllm/model/dropout.h"

namespace mllm {

// dropout_add_layer_norm (kernels/norm.h) with a block's modules: drop's p and training flag, norm's weight, bias and eps. A
// norm over more than the last dimension, or without elementwise affine parameters:
// norm(drop.add_to(residual, branch)), as LibTorch computes it.
torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     DropoutImpl& drop, torch::nn::LayerNormImpl& norm);

}  // namespace mllm
