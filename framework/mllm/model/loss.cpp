// Summed token cross-entropy that ignores pad targets.
#include "mllm/model/loss.h"

#include <string>

#include "mllm/core/error.h"
#include "mllm/model/model.h"

namespace mllm {

namespace {
std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}
}  // namespace

torch::Tensor lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) ||
      logits.size(1) != targets.size(1))
    throw Error("lm_loss_sum: logits " + shape_of(logits) + " and targets " + shape_of(targets) +
                " do not match; expected [batch, seq, vocab] and [batch, seq]");
  if (targets.scalar_type() != torch::kLong)
    throw Error("lm_loss_sum: targets must be int64, got " +
                std::string(c10::toString(targets.scalar_type())));
  const int64_t vocab = logits.size(2);
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, vocab}).to(torch::kFloat), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(kPadId).reduction(torch::kSum));
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kPadId).sum().item<int64_t>();
}

}  // namespace mllm
