// The dropout module (model/dropout.h).
#include "mllm/model/dropout.h"

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {

DropoutImpl::DropoutImpl(double p) : p_(p) {
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("dropout: p must be in [0, 1), got {}", p));
}

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) { return mllm::dropout(x, p_, is_training()); }

torch::Tensor DropoutImpl::of_softmax(const torch::Tensor& scores) {
  return mllm::softmax_dropout(scores, p_, is_training());
}

torch::Tensor DropoutImpl::add_to(const torch::Tensor& residual, const torch::Tensor& branch) {
  return mllm::dropout_add(residual, branch, p_, is_training());
}

}  // namespace mllm
