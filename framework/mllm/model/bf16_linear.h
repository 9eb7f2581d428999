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
// Used by mllm::linear and mllm::linear_relu (model.h) while grad mode and CPU bf16 autocast are
// on. The forward pass runs on the autocast-cached bf16 weight and bias and gives autocast's
// values bit for bit: where the CPU has bf16 units, as oneDNN's fused linear
// (mkldnn::_linear_pointwise: the bias, and the ReLU of linear_relu, applied to the float32
// accumulator, without addmm's copy of the broadcast bias into the output and without a
// separate ReLU pass), else ATen's linear. One exception: oneDNN's ReLU maps a NaN
// pre-activation to 0 where torch::relu keeps the NaN (a NaN there comes from a NaN in x, which
// the residual stream also carries to the loss). The input gradient of a float32 input (the
// residual stream's LayerNorm / RMSNorm output) is oneMKL's product too, returned in float32
// (not rounded to bf16, no cast; 6-17% faster than ATen's bf16 mm at the small shape's Q/K/V,
// feed-forward and head products on an AMX Xeon, bench/README.md); that of a bf16 input is
// ATen's bf16 mm, as before. The bias gradient is a float32 sum from oneMKL.
#pragma once

#include <torch/torch.h>

namespace mllm {

// Whether the weight gradient comes from oneMKL's cblas_gemm_bf16bf16f32: LibTorch's
// libtorch_cpu.so exports it (the x86-64 wheels link oneMKL statically and export its CBLAS
// symbols; looked up in that library, not in a preloaded one) and the CPU has AMX-BF16 (where
// it was measured; bench/README.md), or avx512_bf16 with MLLM_BF16_WEIGHT_GRAD=mkl; never with
// MLLM_BF16_WEIGHT_GRAD=aten. Otherwise mllm::linear, linear_relu and linears are autocast's
// linear layers (none of the fused paths below; nor the fused attention of cpu_attention.h,
// which needs the same GEMM), and weight_grad_float32 falls back to ATen's bf16 mm (one
// rounding to bf16) cast to float32. Decided once per process; throws mllm::ConfigError for
// another value of MLLM_BF16_WEIGHT_GRAD.
bool bf16_weight_grad_uses_mkl();

// oneMKL's cblas_gemm_bf16bf16f32 (oneMKL Developer Reference, "cblas_gemm_bf16bf16f32"):
//   C = alpha * op(A) * op(B) + beta * C,  A [m, k] and B [k, n] bf16 (after op), C [m, n] float32,
// called as gemm(cblas::kRowMajor, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
// with leading dimensions in elements. The CBLAS enums are C enums; MKL_INT is int in the LP64
// interface LibTorch's wheels link (a unit test checks a product against float64, which a wrong
// integer width would not pass).
using GemmBf16Bf16F32 = void (*)(int layout, int transa, int transb, int m, int n, int k,
                                 float alpha, const void* a, int lda, const void* b, int ldb,
                                 float beta, float* c, int ldc);
namespace cblas {
inline constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}  // namespace cblas
// That function where bf16_weight_grad_uses_mkl(), else nullptr (the same decision). Throws as
// bf16_weight_grad_uses_mkl.
GemmBf16Bf16F32 mkl_gemm_bf16bf16f32();

// The decision above in words, for the start-up log ("float32 from oneMKL's ..." or "ATen's
// bf16 product cast to float32: <why>"). Throws as bf16_weight_grad_uses_mkl.
std::string bf16_weight_grad_path();

// g [rows, out] bf16, x [rows, in] bf16 -> [out, in] float32 = g^T @ x (the weight gradient of
// y = x @ W^T), accumulated in float32; contiguous inputs are not copied. Throws mllm::Error for
// other dtypes or shapes.
torch::Tensor weight_grad_float32(const torch::Tensor& g, const torch::Tensor& x);

// g [rows, out] bf16 -> [out] float32 = the sum of g's rows (the bias gradient of y = x @ W^T + b),
// accumulated in float32 and not rounded to bf16: oneMKL's cblas_gemm_bf16bf16f32 as g^T @ 1
// where bf16_weight_grad_uses_mkl() (~3x ATen's bf16 column sum at [2048, 2048]), else ATen's
// sum with a float32 result. Throws mllm::Error for another dtype or rank.
torch::Tensor bias_grad_float32(const torch::Tensor& g);

// g, y [...] bf16 CPU, one shape -> [...] bf16 contiguous: ReLU's gradient for y = relu(.),
// y <= 0 ? 0 : g, bit for bit PyTorch's threshold_backward(g, y, 0) (a NaN in y passes g), in
// one pass over the 16-bit patterns (~2% of the small bf16 step against ATen's kernel, which
// widens both operands to float32). Throws mllm::Error for other dtypes, shapes or devices.
torch::Tensor relu_grad_bf16(const torch::Tensor& g, const torch::Tensor& y);

// y = x @ weight^T + bias under CPU bf16 autocast, for training, or max(0, y) with `relu`:
//   x [..., in] float32 or bf16 (cast to bf16 as autocast would), weight [out, in] float32,
//   bias [out] float32 or undefined -> y [..., out] bf16.
// The bf16 copies of weight and bias come from autocast's cache (at::autocast::cached_cast):
// one cast per weight while the cache lives (the trainer keeps it for a whole optimizer step).
// Backward (with `relu`, through ReLU's gradient first: relu_grad_bf16): the input gradient in
// x's dtype (float32 x: oneMKL's float32 product where bf16_weight_grad_uses_mkl() and the
// sizes fit its int, else ATen's bf16 mm cast; bf16 x: ATen's bf16 mm), the weight gradient in
// float32 (weight_grad_float32), the bias gradient in float32 (bias_grad_float32). The output is
// saved for the backward with `relu`: modifying it in place then makes the backward throw
// (autograd's version check). Requires grad mode and CPU tensors; throws mllm::Error otherwise.
torch::Tensor bf16_autocast_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias, bool relu = false);

// bf16_autocast_linear(x, weights[i], biases[i]) for each i, as one product: weights [out_i, in]
// float32 (their autocast-cached bf16 copies concatenated, [sum out_i, in]), biases [out_i]
// float32 (all or none: empty) -> outputs [..., out_i] bf16, views of one [..., sum out_i]
// tensor (not to be modified in place: autograd forbids it for views made in a custom Function).
// A layer whose output no loss reads gets zero gradients (not undefined ones).
// x is cast to bf16 once. Backward: one input-gradient product over the outputs' gradients side
// by side (read in place where they already lie so in one buffer, as the fused CPU attention
// leaves dq, dk, dv; else concatenated) — the layers' input gradients summed inside the GEMM in
// float32, returned in float32 for a float32 x as bf16_autocast_linear does, else rounded to
// bf16 once — and one float32 weight-gradient product and one bias sum, split back to the
// layers (weight_grad_float32, bias_grad_float32). Throws mllm::Error outside grad mode,
// for non-CPU tensors, differing in-features, a bias count other than 0 or weights.size(), or a
// bias that is not [out_i].
std::vector<torch::Tensor> bf16_autocast_linears(const torch::Tensor& x,
                                                 const std::vector<torch::Tensor>& weights,
                                                 const std::vector<torch::Tensor>& biases);

}  // namespace mllm
