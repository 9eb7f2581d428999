// The linear layer under CPU bf16 autocast, with its weight gradient computed in float32.
//
// Under autocast, ATen's linear computes the weight gradient of a bf16 product as a bf16 GEMM
// (grad^T @ x, rounded to bf16), and autograd then casts it to float32 for the float32 weight.
// On an AMX Xeon that product, whose first operand is transposed (the reduction runs over the
// tokens, the slow dimension of both stored matrices), ran at ~1.1 TFLOP/s in oneDNN, against
// ~2 TFLOP/s for the forward products; oneMKL's cblas_gemm_bf16bf16f32 (bf16 operands, float32
// result; the oneMKL reference, "cblas_gemm_bf16bf16f32") runs it at ~2 TFLOP/s and writes the
// float32 gradient directly: no bf16 rounding of the gradient, and no cast.
//
// Used by mllm::linear (model.h) while grad mode and CPU bf16 autocast are on. The forward pass
// is ATen's linear on the autocast-cached bf16 weight and bias, bit for bit what autocast runs;
// the input gradient is ATen's bf16 mm, as before.
#pragma once

#include <torch/torch.h>

namespace mllm {

// Whether the weight gradient comes from oneMKL's cblas_gemm_bf16bf16f32: LibTorch's
// libtorch_cpu.so exports it (the x86-64 wheels link oneMKL statically and export its CBLAS
// symbols; looked up in that library, not in a preloaded one) and the
// CPU has AMX-BF16 (where it was measured; bench/README.md), or avx512_bf16 with
// MLLM_BF16_WEIGHT_GRAD=mkl; never with MLLM_BF16_WEIGHT_GRAD=aten. Otherwise mllm::linear is
// autocast's, and weight_grad_float32 falls back to ATen's bf16 mm (one rounding to bf16) cast
// to float32. Decided once per process; throws mllm::ConfigError for another value of
// MLLM_BF16_WEIGHT_GRAD.
bool bf16_weight_grad_uses_mkl();

// The decision above in words, for the start-up log ("float32 from oneMKL's ..." or "ATen's
// bf16 product cast to float32: <why>"). Throws as bf16_weight_grad_uses_mkl.
std::string bf16_weight_grad_path();

// g [rows, out] bf16, x [rows, in] bf16 -> [out, in] float32 = g^T @ x (the weight gradient of
// y = x @ W^T), accumulated in float32; contiguous inputs are not copied. Throws mllm::Error for
// other dtypes or shapes.
torch::Tensor weight_grad_float32(const torch::Tensor& g, const torch::Tensor& x);

// y = x @ weight^T + bias under CPU bf16 autocast, for training:
//   x [..., in] float32 or bf16 (cast to bf16 as autocast would), weight [out, in] float32,
//   bias [out] float32 or undefined -> y [..., out] bf16.
// The bf16 copies of weight and bias come from autocast's cache (at::autocast::cached_cast):
// one cast per weight while the cache lives (the trainer keeps it for a whole optimizer step).
// Backward: the input gradient in x's dtype (ATen's bf16 mm), the weight gradient in float32
// (weight_grad_float32), the bias gradient as autocast's (a bf16 sum over the rows, accumulated
// in float32 and rounded once) in float32. Requires grad mode and CPU tensors; throws mllm::Error
// otherwise.
torch::Tensor bf16_autocast_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias);

}  // namespace mllm
