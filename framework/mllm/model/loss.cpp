// The model-level loss (kernels/cross_entropy.h): the output head and the summed cross-entropy, fused where
// the op allows.
#include "mllm/model/loss.h"

#include "mllm/core/special_tokens.h"
#include "mllm/kernels/linear.h"

namespace mllm {

torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias, const torch::Tensor& targets) {
  if (lm_head_loss_fusable(x, weight)) return lm_head_loss_sum(x, weight, bias, targets);
  return lm_loss_sum(linear(x, weight, bias), targets);
}

torch::Tensor head_loss(const torch::nn::Linear& head, const torch::Tensor& x,
                        const torch::Tensor& targets) {
  return head_loss(x, head->weight, head->bias, targets);
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kPadId).sum().item<int64_t>();
}

}  // namespace mllm
