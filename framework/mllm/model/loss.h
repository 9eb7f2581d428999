// The language-modelling loss: token cross-entropy summed over real (non-pad) targets. The
// trainer divides the sum by the number of real targets of the whole global batch, so every
// token weighs the same whatever the micro-batch, accumulation or world size.
#pragma once

#include <torch/torch.h>

#include <cstdint>

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

// Number of targets != kPadId in targets [batch, seq] int64 (or any shape).
int64_t count_targets(const torch::Tensor& targets);

}  // namespace mllm
