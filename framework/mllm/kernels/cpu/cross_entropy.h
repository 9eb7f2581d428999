// The cross-entropy's row passes on the CPU, for the op of kernels/cross_entropy.h: each row of
// logits read once or twice while it is in cache, in 16-lane float32 arithmetic with vec16's
// exp (Cephes' expf, 1-2 units in the last place), compiled for x86-64-v4, v3 and the baseline
// (the v3 and v4 versions give the same bits; the baseline's, without FMA, may differ in the last
// bit of a float32 value). Rows in parallel (at::parallel_for, ~64 K logits a task); no autograd
// here: the op's autograd Functions call these.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace mllm::cpu {

// Whether bf16 logits x [rows, vocab] take the row passes: on the CPU, vocab > 0.
bool bf16_rows_apply(const torch::Tensor& x);
// Whether float32 logits x [rows, vocab] take them: on the CPU, vocab > 0.
bool f32_rows_apply(const torch::Tensor& x);

// x [rows, vocab] bf16 contiguous on the CPU -> per-row log-sum-exp [rows] float32: the row's
// maximum m, then log(sum_k exp(x_k - m)) + m. (About 1.7x LibTorch's amax / exp / sum over
// float32 copies of the rows, forward and backward together, at [2048, 8192].)
torch::Tensor row_lse_bf16(const torch::Tensor& x);

// The gradient of the summed loss for bf16 logits x [rows, vocab], lse [rows] float32
// (row_lse_bf16), scale [rows] float32 (the upstream gradient, 0 on pad rows), targets [rows]
// int64 -> [rows, vocab] bf16 = bf16(exp(x - lse) * scale), and at the target
// bf16(exp(x - lse) * scale - scale): softmax minus one-hot in float32, rounded once.
torch::Tensor ce_grad_bf16(const torch::Tensor& x, const torch::Tensor& lse,
                           const torch::Tensor& scale, const torch::Tensor& targets);

// x [rows, vocab] float32 contiguous on the CPU -> {the rows' maxima m [rows], sums of exp(x - m)
// [rows]} float32: softmax(x) = exp(x - m) / sum, log-sum-exp = log(sum) + m (x - m is exact
// near the maximum, as in ATen's softmax).
std::pair<torch::Tensor, torch::Tensor> softmax_stats_f32(const torch::Tensor& x);

// The gradient of the summed loss for float32 logits x [rows, vocab], mx [rows] (the maxima of
// softmax_stats_f32), factor [rows] = scale / sum, scale [rows] (the upstream gradient, 0 on pad
// rows), targets [rows] int64 -> [rows, vocab] float32 = exp(x - mx) * factor, and at the target
// that minus scale: (softmax - one-hot) * scale, in one pass over each row.
torch::Tensor ce_grad_f32(const torch::Tensor& x, const torch::Tensor& mx,
                          const torch::Tensor& factor, const torch::Tensor& scale,
                          const torch::Tensor& targets);

// The fused head's loss and, where asked for, the gradients for an upstream gradient of 1.
struct HeadLoss {
  torch::Tensor loss;        // [] float32
  torch::Tensor dx, dw, db;  // [rows, d], [vocab, d], [vocab] float32; undefined unless asked
};

// The float32 head and summed loss over chunks of rows: x [rows, d] float32 contiguous, weight
// [vocab, d] float32 contiguous, bias [vocab] float32 or undefined, targets [rows] int64
// contiguous (ids checked by the caller), all on the CPU -> HeadLoss. Chunk by chunk of
// max(64, 2^20 / vocab) rows on one thread, max(64, 2^22 / vocab) on more: logits = x_c weight^T
// into one reused buffer (oneMKL's packed GEMM where exported, mkl_gemm.h); then row by row the
// bias added in the pass that takes the row's maximum and sum of exp (as addmm, one rounding of
// product + bias), its target logit and, for gradients, the row turned into (softmax - one-hot)
// in place while it is in cache (also summing the columns for db); then dx_c = g_c weight and
// dw += g_c^T x_c. The loss is the unfused path's formula over the same per-row values: the sum
// over real rows of log(sum) + max - x[target]. The gradients are those for an upstream
// gradient of 1; want_dx, want_dw, want_db say which to compute.
HeadLoss head_loss_chunks(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const torch::Tensor& targets, bool want_dx,
                          bool want_dw, bool want_db);

}  // namespace mllm::cpu
