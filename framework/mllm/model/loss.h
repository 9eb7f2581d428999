// The language-modelling loss: token cross-entropy summed over real (non-pad) targets. The
// trainer divides the sum by the number of real targets of the whole global batch, so every
// token weighs the same whatever the micro-batch, accumulation or world size.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace mllm {

// logits [batch, seq, vocab] (any float dtype; computed in float32), targets [batch, seq] int64
// -> [] float32: the sum over positions with target != kPadId of -log softmax(logits)[target].
// Pad targets add exactly nothing (an all-pad batch gives 0, not NaN). Differentiable.
// Throws mllm::Error when the shapes disagree or targets is not int64.
torch::Tensor lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets);

// Number of targets != kPadId in targets [batch, seq] int64 (or any shape).
int64_t count_targets(const torch::Tensor& targets);

}  // namespace mllm
