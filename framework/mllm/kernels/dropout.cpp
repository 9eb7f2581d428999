// Dropout, the op: the device path chosen per call (kernels/dropout.h).
#include "mllm/kernels/dropout.h"

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {

namespace {
void check_p(double p) {
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("dropout: p must be in [0, 1), got {}", p));
}
}  // namespace

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  check_p(p);
  if (!training || p == 0.0) return x;
  if (!x.is_floating_point())
    throw Error(fmt::format("dropout: needs a floating-point tensor, got {}",
                            c10::toString(x.scalar_type())));
  if (!x.device().is_cpu()) return at::dropout(x, p, /*train=*/true);
  return cpu::dropout(x, draw_dropout(p));
}

torch::Tensor dropout_add(const torch::Tensor& residual, const torch::Tensor& branch, double p,
                          bool training) {
  check_p(p);
  if (!cpu::dropout_add_applies(residual, branch))
    return residual + mllm::dropout(branch, p, training);
  if (!training || p == 0.0) return cpu::dropout_add(residual, branch, nullptr);
  const DropoutDraw d = draw_dropout(p);
  return cpu::dropout_add(residual, branch, &d);
}

torch::Tensor softmax_dropout(const torch::Tensor& scores, double p, bool training) {
  check_p(p);
  if (!(training && p > 0.0 && cpu::softmax_dropout_applies(scores)))
    return mllm::dropout(torch::softmax(scores, -1), p, training);
  return cpu::softmax_dropout(scores, draw_dropout(p));
}

}  // namespace mllm
