// The language-modelling loss, the op: token cross-entropy summed over real (non-pad) targets, as
// one autograd node, and the float32 CPU output head with that loss as one. The path is chosen
// here per call from the logits' dtype and device: mllm's row passes on the CPU
// (kernels/cpu/cross_entropy.h), LibTorch's ops elsewhere; lm_head_loss_fusable says where the
// fused head applies (the model-level choice is head_loss, model/loss.h).
#pragma once

#include <torch/torch.h>

namespace mllm {

// logits [batch, seq, vocab] (any float dtype; computed in float32), targets [batch, seq] int64
// -> [] float32: the sum over positions with target != kPadId of -log softmax(logits)[target].
// Pad targets add exactly nothing (an all-pad batch gives 0, not NaN). Differentiable, as one
// autograd node (not log_softmax + nll_loss), over cache-sized row chunks on CPU:
// - float32 (and float64, computed in float32) logits on the CPU: the forward pass keeps the
//   logits and each row's maximum and sum of exp(x - max) (two passes over each row in cache,
//   mllm's vectorized exp: Cephes' expf, 1-2 units in the last place); the backward pass
//   recomputes exp(x - max) and writes (softmax - one-hot) * upstream in one pass (a logit more
//   than 87 below its row's maximum, -inf included, gets e^-87 / sum ~ 1.6e-38 / sum of the
//   upstream gradient, where ATen's exp gives the smaller true value or 0);
// - float32 and float64 logits off the CPU (a GPU): the forward pass keeps softmax(logits) in one
//   [batch * seq, vocab] float32 buffer with one exp per element, and the backward pass turns
//   that buffer into the gradient in place, so such a loss can be backpropagated once
//   (retain_graph is refused with mllm::Error);
// - bf16 / half logits (bf16 autocast): the forward pass keeps the logits and a float32
//   log-sum-exp per row; the backward pass recomputes exp(x - lse) in float32 and returns the
//   gradient in the logits' dtype, rounded once.
// Without grad mode it keeps nothing. Throws mllm::Error when the shapes disagree, targets is
// not int64, or (CPU) a target id is outside [0, vocab).
torch::Tensor lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets);

// The output head and lm_loss_sum in one, without the [batch * seq, vocab] logits in memory
// (the "fused linear cross-entropy" of Liger Kernel, Hsu et al. 2024, arXiv:2410.10989, on the
// CPU): x [batch, seq, d] float32 (the last hidden states), weight [vocab, d] float32, bias
// [vocab] float32 or undefined, targets [batch, seq] int64 -> [] float32 equal to
// lm_loss_sum(torch::linear(x, weight, bias), targets) up to float32 rounding (the same row
// kernels over the same logits; the logits' products run on chunks of rows). The work runs
// chunk by chunk of max(64, 2^20 / vocab) rows on one thread, max(64, 2^22 / vocab) on more
// (4 or 16 MiB of float32 logits, more above vocab 16384 or 65536), so each chunk stays in
// cache from its product through the row passes.
// With grad mode on and a gradient wanted (x, weight or bias requiring grad), the forward pass
// also computes the gradients for an upstream gradient of 1 (dx = g weight, dweight = sum over
// chunks of g^T x, dbias = column sums of g, g = softmax - one-hot on real targets, 0 on pad
// targets) and keeps only them ([rows, d], [vocab, d], [vocab] float32: no logits, freed by the
// backward pass); the backward pass multiplies them by the upstream gradient (more than once
// with retain_graph). So the head's products run in the forward pass (the trainer's forward
// time includes them). The gradients equal the unfused path's up to float32 rounding (the
// upstream factor is applied after the products instead of before, and dweight is summed over
// chunks). Not differentiable twice (create_graph gives no second derivatives through it).
// Throws mllm::Error when the shapes disagree, targets is not int64 or an id is outside
// [0, vocab), lm_head_loss_fusable is false, or the bias is not float32 on the CPU. (Under CPU
// bf16 autocast the head stays a bf16 linear: chunks through oneMKL's bf16 GEMM ran no faster
// there, bench/README.md.)
torch::Tensor lm_head_loss_sum(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const torch::Tensor& targets);

// Whether lm_head_loss_sum takes x and weight: both float32 on the CPU, weight [vocab >= 1, d],
// and CPU autocast off (under bf16 autocast the head runs as a bf16 linear and lm_loss_sum
// takes its bf16 logits).
bool lm_head_loss_fusable(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace mllm
