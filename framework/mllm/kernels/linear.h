// The linear layer, the op: y = x @ weight^T + bias, its ReLU form, and several layers that read
// one input as one product. The path is chosen here, per call, in this order:
//   1. under CPU bf16 autocast, a float32 weight on the CPU, where bf16_products_in_mllm()
//      (kernels/cpu/bf16_linear.h: oneMKL's bf16 GEMM, or float32 sgemm on widened bf16
//      operands where the bf16 GEMM is slow): bf16_autocast_linear(s) — the forward values of
//      autocast's linear bit for bit on oneMKL's path (summed in another float32 order on the
//      sgemm path), the weight and bias gradients in float32;
//   2. float32 x and weight on the CPU outside autocast: f32_linear(s)
//      (kernels/cpu/f32_linear.h) — torch::linear's values bit for bit without addmm's broadcast
//      copy of the bias;
//   3. otherwise ATen's linear op as PyTorch's nn.Linear calls it (CUDA, other dtypes, and
//      autocast's own bf16 products with MLLM_BF16_GEMM=aten).
// Paths 1 and 2 apply in grad mode and outside it alike, so that evaluation and activation
// checkpointing's first pass compute what training does. The module forms the model families
// call are in model/model.h.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace mllm {

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out]. Errors: as torch::linear's
// (c10::Error), or mllm::Error for mismatched shapes on the float32 CPU path.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias);

// relu(linear(x, weight, bias)), the same values [..., out]; on path 1 one fused op (oneDNN, or the
// sgemm path's rounding pass, applies the ReLU to the float32 accumulator before rounding, which
// equals rounding first, as ReLU commutes with rounding; a NaN pre-activation gives 0 with oneDNN
// instead of NaN); on path 2 f32_linear with relu (the ReLU in place on the product, the same
// values).
torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias);

// {linear(x, weights[i], biases[i])} for several layers reading the same x [..., in] (attention's
// Q/K/V projections, SwiGLU's gate and up), each [..., out_i], the same values. biases: one per
// weight, each [out_i] or undefined. Where every layer is on path 1 (or every layer on path 2),
// all have the same in-features and all a bias or none: one product (bf16_autocast_linears:
// x cast once, one GEMM over the concatenated bf16 weights; f32_linears: one float32 product
// over the concatenated weights, whose values are the separate layers' up to float32 rounding,
// as a product over more columns may block its sums differently); the outputs are then views
// of one tensor and must not be modified in place. Otherwise one linear() per layer. Errors:
// as linear's; mllm::Error when biases.size() != weights.size().
std::vector<torch::Tensor> linears(const torch::Tensor& x,
                                   const std::vector<torch::Tensor>& weights,
                                   const std::vector<torch::Tensor>& biases);

}  // namespace mllm
