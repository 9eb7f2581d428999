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
// Used by mllm::linear and mllm::linear_relu (kernels/linear.h) while CPU bf16 autocast is on, in
// grad mode and outside it. The forward pass runs on the autocast-cached bf16 weight and bias and
// gives autocast's values bit for bit: where the CPU has bf16 units, as oneDNN's fused linear
// (mkldnn::_linear_pointwise: the bias, and the ReLU of linear_relu, applied to the float32
// accumulator, without addmm's copy of the broadcast bias into the output and without a separate
// ReLU pass), else ATen's linear. One exception: oneDNN's ReLU maps a NaN pre-activation to 0 where
// torch::relu keeps the NaN (a NaN there comes from a NaN in x, which the residual stream also
// carries to the loss). The input gradient of a float32 input (the residual stream's LayerNorm /
// RMSNorm output) is oneMKL's product too, returned in float32 (not rounded to bf16, no cast; 6-17%
// faster than ATen's bf16 mm at the small shape's Q/K/V, feed-forward and head products on an AMX
// Xeon, bench/README.md); that of a bf16 input is ATen's bf16 mm, as before. The bias gradient is a
// float32 sum from oneMKL.
//
// On a CPU whose bf16 GEMM is slower than its float32 one (Bf16GemmPath::kSgemm below: a Xeon
// without AMX ran oneMKL's and oneDNN's bf16 products at half the fp32 rate), every one of these
// products is oneMKL's float32 sgemm on the bf16 operands widened to float32, which gives the
// same values up to the order of the float32 additions; the forward then adds the bias, applies
// the ReLU and rounds to bf16 in one pass (one rounding, as oneDNN's fused linear). Saved
// tensors stay bf16: the backward widens them again.
#pragma once

#include <torch/torch.h>

namespace mllm {

// Which GEMM runs mllm's bf16 training products (the linear layers below and the fused
// attention of attention.h). Decided once per process (bf16_gemm_path or choose_bf16_gemm,
// whichever comes first), from MLLM_BF16_GEMM when it is set, else from the CPU and, where the
// trainer measured them, its GEMM rates:
//   kMkl:   oneMKL's cblas_gemm_bf16bf16f32 from libtorch_cpu.so (the x86-64 wheels link oneMKL
//           statically and export its CBLAS symbols; looked up in that library, not a preloaded
//           one). The default on CPUs with AMX-BF16 (where it was measured), and on CPUs with
//           avx512_bf16 alone where the trainer measured oneMKL's bf16 GEMM at 0.9 or more of
//           ATen's and the bf16 GEMM not below 0.8 of the fp32 one (the fused paths below then
//           do less work per step at about the same GEMM rate: bench/README.md);
//           MLLM_BF16_GEMM=mkl forces it where the CPU has bf16 units.
//   kSgemm: the bf16 operands widened to float32 (exact: a bf16 value is a float32 with the low
//           16 bits zero) and oneMKL's float32 sgemm. Every product of two bf16 values is exact in
//           float32 and the sum accumulates in float32, as in a bf16 GEMM with a float32
//           accumulator: the results differ from kMkl's only in the order of the additions. The
//           default where the trainer measured the bf16 GEMM below 0.8 of the fp32 one
//           (choose_bf16_gemm: a CPU whose bf16 units are slow or absent; the widening costs
//           5-10% of a product, bench/README.md); MLLM_BF16_GEMM=sgemm forces it.
//   kAten:  none: mllm::linear, linear_relu and linears are autocast's linear layers (ATen's
//           bf16 products; none of the fused paths below, nor the fused bf16 attention), and
//           weight_grad_float32 falls back to ATen's bf16 mm (one rounding to bf16) cast to
//           float32, bias_grad_float32 to ATen's sum. Elsewhere, and with MLLM_BF16_GEMM=aten.
// MLLM_BF16_GEMM takes mkl, sgemm or aten; a path this process cannot take (mkl without bf16
// units or without the oneMKL symbol, sgemm without an sgemm_) falls back to kAten, and
// describe_bf16_gemm says why.
enum class Bf16GemmPath { kAten, kMkl, kSgemm };

// The path in use (deciding it without GEMM rates if nothing has yet). Throws mllm::ConfigError
// for another value of MLLM_BF16_GEMM, or when the retired MLLM_BF16_WEIGHT_GRAD is set.
Bf16GemmPath bf16_gemm_path();

// Decides the path from the measured GEMM rates of this job's CPUs (FLOP/s at the thread count
// the run trains with; 0 where not measured: bf16 and fp32 from ATen's mm, mkl_bf16 from
// oneMKL's cblas_gemm_bf16bf16f32, mfu.h) unless it is already decided, and returns the path in
// use. The trainer calls it at start-up before the model's first product, with the job-wide
// rates every rank shares, and stops (ConfigError) if the ranks still differ (MLLM_BF16_GEMM set
// differently, or CPUs with and without AMX or avx512_bf16 in one job). Throws as
// bf16_gemm_path.
Bf16GemmPath choose_bf16_gemm(double bf16_flops, double fp32_flops, double mkl_bf16_flops = 0);

// The path the decision above wants (before the functions are looked up: bf16_gemm_path falls
// back to kAten where libtorch_cpu.so lacks one), as a function of its inputs: env =
// MLLM_BF16_GEMM's value ("" when unset), the CPU's amx_bf16 and avx512_bf16 flags, and the
// measured GEMM rates in FLOP/s (0 when not measured; mkl_bf16: oneMKL's bf16 GEMM). In order:
// the variable; AMX -> kMkl; bf16 < 0.8 fp32 -> kSgemm; avx512_bf16 with mkl_bf16 >= 0.9 bf16
// -> kMkl; else kAten. Throws mllm::ConfigError for another env.
Bf16GemmPath wanted_bf16_gemm_path(const std::string& env, bool amx_bf16, bool avx512_bf16,
                                   double bf16_flops, double fp32_flops, double mkl_bf16_flops);

// Whether the decision reads oneMKL's bf16 GEMM rate (the mkl_bf16 argument above): with
// MLLM_BF16_GEMM unset on a CPU with avx512_bf16 and no AMX-BF16. The trainer times that GEMM
// only then (mfu.h).
bool bf16_gemm_choice_reads_mkl_rate();

// Whether mllm's own bf16 training products run (kMkl or kSgemm), rather than autocast's.
// Throws as bf16_gemm_path.
bool bf16_products_in_mllm();

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

// oneMKL's cblas_gemm_bf16bf16f32 as LibTorch's libtorch_cpu.so exports it (looked up in that
// library, not a preloaded one), whichever path is in use; nullptr where it is not exported.
// For timing it (mfu.h); the products go through bf16_gemm_f32().
GemmBf16Bf16F32 mkl_gemm_bf16bf16f32();

// The GEMM of that form for the path in use: oneMKL's (kMkl), sgemm_on_widened_bf16 (kSgemm),
// nullptr (kAten). Throws as bf16_gemm_path.
GemmBf16Bf16F32 bf16_gemm_f32();

// The same product as cblas_gemm_bf16bf16f32 (row-major only: layout is not read) through
// oneMKL's float32 sgemm: op(A) and op(B) widened to float32 into this thread's scratch buffers
// (m k and k n floats, kept for the thread's next call: meant for the fused attention's
// per-block products; the linear layers widen into tensors), then one sgemm. Widens in parallel
// (at::parallel_for) when called outside a parallel region. Requires mkl_sgemm_available()
// (mkl_gemm.h).
void sgemm_on_widened_bf16(int layout, int transa, int transb, int m, int n, int k, float alpha,
                           const void* a, int lda, const void* b, int ldb, float beta, float* c,
                           int ldc);

// The decision in words, for the start-up log ("oneMKL's cblas_gemm_bf16bf16f32 (float32
// results): <why>", "oneMKL's float32 sgemm on the bf16 operands widened to float32: <why>",
// "ATen's bf16 products (autocast's linear layers): <why>"). Throws as bf16_gemm_path.
std::string describe_bf16_gemm();

// g [rows, out] bf16, x [rows, in] bf16 -> [out, in] float32 = g^T @ x (the weight gradient of
// y = x @ W^T), accumulated in float32: oneMKL's cblas_gemm_bf16bf16f32 under kMkl (contiguous
// inputs are not copied), ATen's float32 mm of the widened operands under kSgemm, ATen's bf16 mm
// cast to float32 under kAten. Throws mllm::Error for other dtypes or shapes.
torch::Tensor weight_grad_float32(const torch::Tensor& g, const torch::Tensor& x);

// g [rows, out] bf16 -> [out] float32 = the sum of g's rows (the bias gradient of y = x @ W^T + b),
// accumulated in float32 and not rounded to bf16: oneMKL's cblas_gemm_bf16bf16f32 as g^T @ 1
// under kMkl (~3x ATen's bf16 column sum at [2048, 2048]), else ATen's sum with a float32
// result. Throws mllm::Error for another dtype or rank.
torch::Tensor bias_grad_float32(const torch::Tensor& g);

// g, y [...] bf16 CPU, one shape -> [...] bf16 contiguous: ReLU's gradient for y = relu(.),
// y <= 0 ? 0 : g, bit for bit PyTorch's threshold_backward(g, y, 0) (a NaN in y passes g), in
// one pass over the 16-bit patterns (~2% of the small bf16 step against ATen's kernel, which
// widens both operands to float32). Throws mllm::Error for other dtypes, shapes or devices.
torch::Tensor relu_grad_bf16(const torch::Tensor& g, const torch::Tensor& y);

// y = x @ weight^T + bias under CPU bf16 autocast, or max(0, y) with `relu`:
//   x [..., in] float32 or bf16 (cast to bf16 as autocast would), weight [out, in] float32,
//   bias [out] float32 or undefined -> y [..., out] bf16.
// The bf16 copies of weight and bias come from autocast's cache (at::autocast::cached_cast):
// one cast per weight while the cache lives (the trainer keeps it for a whole optimizer step).
// Backward (with `relu`, through ReLU's gradient first: relu_grad_bf16): the input gradient in
// x's dtype (float32 x: a float32 result, from oneMKL's bf16 GEMM where the sizes fit its int
// or from ATen's float32 mm of the widened operands under kSgemm, else ATen's bf16 mm cast; bf16 x: ATen's bf16 mm, or under kSgemm the float32 product rounded to
// bf16 once), the weight gradient in float32 (weight_grad_float32), the bias gradient in float32
// (bias_grad_float32). The output is saved for the backward with `relu`: modifying it in place
// then makes the backward throw (autograd's version check). Outside grad mode (evaluation,
// generation, activation checkpointing's first pass) the same forward without autograd, so that
// a checkpointed block's recomputation gives its first pass's values. Requires CPU tensors;
// throws mllm::Error otherwise.
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
// layers (weight_grad_float32, bias_grad_float32). Outside grad mode: the same forward without
// autograd. Throws mllm::Error for non-CPU tensors, differing in-features, a bias count other
// than 0 or weights.size(), or a bias that is not [out_i].
std::vector<torch::Tensor> bf16_autocast_linears(const torch::Tensor& x,
                                                 const std::vector<torch::Tensor>& weights,
                                                 const std::vector<torch::Tensor>& biases);

}  // namespace mllm
