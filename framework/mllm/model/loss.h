// The language-modelling loss of a model: token cross-entropy summed over real (non-pad) targets
// (the op: kernels/cross_entropy.h). The trainer divides the sum by the number of real targets of
// the whole global batch, so every token weighs the same whatever the micro-batch, accumulation
// or world size.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "mllm/kernels/cross_entropy.h"

namespace mllm {

// The summed loss of an output head over hidden states x [batch, seq, d] with targets [batch,
// seq] int64 -> [] float32: lm_head_loss_sum(x, weight, bias, targets) where
// lm_head_loss_fusable(x, weight) (float32 on the CPU outside autocast), else
// lm_loss_sum(linear(x, weight, bias), targets). bias may be undefined. Same errors as
// those.
torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias, const torch::Tensor& targets);
// The same for a Linear head, whose logits go through linear() (its bf16 training path) when
// not fused.
torch::Tensor head_loss(const torch::nn::Linear& head, const torch::Tensor& x,
                        const torch::Tensor& targets);

// Number of targets != kPadId in targets [batch, seq] int64 (or any shape).
int64_t count_targets(const torch::Tensor& targets);

}  // namespace mllm
