// Dropout, the op (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent Neural Networks from
// Overfitting"; inverted: kept elements scaled by 1 / (1 - p) in training). The choice among its
// device paths is made here, once per call:
//   - CPU: mllm's counter-based kernel (kernels/cpu/dropout.h): one 64-bit seed from the default
//     CPU generator per call, element i's keep bit from a hash of (seed, i / 2); the mask does not
//     depend on the thread count, and the backward regenerates it;
//   - CUDA (any other device): LibTorch's at::dropout (a counter-based Philox already).
// The fused forms (dropout_add, softmax_dropout) take mllm's one-pass CPU kernels where their
// conditions hold and are the eager composition otherwise: the same values and the same random
// draws either way (the fused backward of softmax_dropout agrees with the unfused one to float32
// rounding of a row sum). The module form used by the models is model/dropout.h.
#pragma once

#include <torch/torch.h>

#include "mllm/kernels/cpu/dropout.h"

namespace mllm {

// Inverted dropout: in training, y = x * keep / (1 - p) with keep ~ Bernoulli(1 - p) per
// element (P(keep) = 1 - round(p * 2^24) / 2^24 on the CPU); x otherwise, or when p == 0.
// x: any shape, float32 / bfloat16 / float16 (CPU) or any floating dtype (CUDA); y: same shape
// and dtype, contiguous. p in [0, 1). Differentiable in x. Throws mllm::Error for p outside
// [0, 1) or a non-floating x.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// residual + dropout(branch, p, training), the same values and the same random draws (one seed
// per call in training with p > 0, none otherwise). For a float32 residual and a bf16 branch of
// one shape, contiguous on the CPU (the residual stream and a block's output under bf16
// autocast) one pass (cpu::dropout_add). Otherwise residual + dropout(branch). Result: the sum's
// shape and dtype (float32 for the fused case). Throws mllm::Error as dropout.
torch::Tensor dropout_add(const torch::Tensor& residual, const torch::Tensor& branch, double p,
                          bool training);

// dropout(softmax(scores, -1), p, training), the same values and random draws (attention's
// probabilities). For bf16 scores, contiguous, with an even last dimension, on the CPU in
// training with p > 0: cpu::softmax_dropout, a backward in one pass instead of two, which agrees
// with the unfused backward to float32 rounding of the row sum (its summation order differs).
// scores [..., keys] -> [..., keys], scores' dtype. Throws mllm::Error as dropout.
torch::Tensor softmax_dropout(const torch::Tensor& scores, double p, bool training);

}  // namespace mllm
