// The normalizations of the model families on the CPU in float32, one pass per row:
// - minillm's post-LN residual step, LayerNorm(x + Dropout(Sublayer(x))) (Vaswani et al. 2017,
//   "Attention Is All You Need", Sec. 3.1 and 5.4). LibTorch runs it as three ops forward (the
//   dropout, the add, layer_norm) and two backward (layer_norm's, the dropout's), each a pass
//   over the [rows, d_model] activations with its own output; here the sum, its statistics and
//   the normalized output are computed while a row is in cache, and the backward writes both
//   input gradients in one pass.
// - llama's RMSNorm, which LibTorch runs as five elementwise ops and a reduction forward and
//   about twice as many backward.
// The ops, with the choice between these kernels and LibTorch's composition, are kernels/norm.h.
#pragma once

#include <torch/torch.h>

namespace mllm::cpu {

// Whether dropout_add_layer_norm below takes these: residual and branch float32 CPU tensors of
// one shape [..., d], weight and bias float32 CPU [d], d a multiple of 16, and CPU autocast off.
bool add_layer_norm_applies(const torch::Tensor& residual, const torch::Tensor& branch,
                            const torch::Tensor& weight, const torch::Tensor& bias);

// layer_norm(residual + dropout(branch, p, training), [d], weight, bias, eps) in one pass per row
// (kernels/norm.h states what it computes and how close it is to LibTorch's), in grad mode and
// out of it alike. One seed from the default CPU generator in training with p > 0 (draw_dropout,
// as dropout_add takes), none otherwise. Requires add_layer_norm_applies and p in [0, 1).
torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     double p, bool training, const torch::Tensor& weight,
                                     const torch::Tensor& bias, double eps);

// Whether rms_norm below takes these: x and weight float32 CPU tensors and d (x's last dimension,
// weight's length) a positive multiple of 16; CPU autocast on or off.
bool rms_norm_applies(const torch::Tensor& x, const torch::Tensor& weight);

// RMSNorm in one pass per row (kernels/norm.h), in grad mode and out of it alike. Requires
// rms_norm_applies and weight [d] for x [..., d].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace mllm::cpu
