// The normalizations of the model families, the ops: LayerNorm after the residual step (minillm's
// post-LN blocks) and RMSNorm (llama). The choice of path is made here per call: mllm's one-pass
// CPU kernels (kernels/cpu/norm.h) where their conditions hold, else LibTorch's composition (on
// CUDA, under CPU autocast for the LayerNorm step, for widths that are not a multiple of 16).
// The module form of the residual step is model/norm.h.
#pragma once

#include <torch/torch.h>

namespace mllm {

// layer_norm(residual + dropout(branch, p, training), [d], weight, bias, eps):
// residual and branch [..., d] of one shape, weight and bias [d] -> [..., d] (the composition's
// dtype). The same random draws as dropout_add (kernels/dropout.h: one seed from the default CPU
// generator per call in training with p > 0, none otherwise), and the same mask.
//
// Fused when residual and branch are float32 CPU tensors of one shape, weight and bias float32
// CPU [d], d a multiple of 16, and CPU autocast is off; in grad mode and out of it alike (so
// activation checkpointing's first pass computes what its recomputation does):
//   s = residual + dropout(branch)        bit for bit LibTorch's sum
//   y = (s - mean) * rstd * weight + bias, mean and var (biased, as torch.nn.LayerNorm) of each
//       row of s, rstd = 1 / sqrt(var + eps); the row sums in 16 lanes in a fixed order
// and its backward, from g = dL/dy and xhat = (s - mean) * rstd:
//   ds = rstd (g w - mean(g w) - xhat mean(g w xhat))   (LayerNorm's input gradient)
//   d residual = ds, d branch = ds * keep * 1 / (1 - p), d weight = sum_rows g xhat,
//   d bias = sum_rows g, the row sums taken per block of 32 rows and the blocks added in order:
//   the same bits at any thread count.
// The values agree with LibTorch's layer_norm to float32 rounding (its summation order and
// multiply-adds differ), not bit for bit: docs/precision.md. The forward contracts no
// multiply-adds, so every code path gives the same bits; in the backward the v3 and v4 (AVX2,
// AVX-512) paths give the same bits, the baseline x86-64 one (no FMA) may differ in the last
// bits. First-order gradients only (the backward is not itself differentiable).
// Otherwise torch::layer_norm(dropout_add(residual, branch, p, training), {d}, weight, bias, eps).
// Differentiable in residual, branch, weight and bias. Throws mllm::Error for p outside [0, 1),
// and as dropout_add and torch::layer_norm for shapes that disagree.
torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     double p, bool training, const torch::Tensor& weight,
                                     const torch::Tensor& bias, double eps);

// RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; as Meta's llama and
// transformers' LlamaRMSNorm): y = (x * rstd) * weight, rstd = 1 / sqrt(mean(x^2) + eps) over
// the last dimension, computed in float32. x [..., d], weight [d] -> [..., d]: the composition
// x.to(float32) * rsqrt(mean(x^2) + eps), cast back to x's dtype, times weight.
//
// Fused when x and weight are float32 CPU tensors and d (a multiple of 16) is weight's length;
// CPU autocast on or off (these ops run in float32 for float32 inputs either way); in grad mode
// and out of it alike: one pass per row, the mean of squares in 16 lanes in a fixed order. Its
// backward, from g = dL/dy and xhat = x * rstd: dx = rstd (g w - xhat mean(g w xhat)), d weight
// = sum_rows g xhat, summed per block of 32 rows and the blocks added in order (the same bits at
// any thread count). Agrees with the composition to float32 rounding, not bit for bit; the v3
// and v4 code paths give the same bits, the baseline one may differ in the last bits. Otherwise
// the composition. Differentiable in x and weight (first order, as dropout_add_layer_norm).
// Throws mllm::Error unless weight is [d] for x [..., d].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace mllm
