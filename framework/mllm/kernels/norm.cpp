// The normalizations, the ops: the path chosen per call (kernels/norm.h).
#include "mllm/kernels/norm.h"

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/norm.h"
#include "mllm/kernels/dropout.h"

namespace mllm {

torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     double p, bool training, const torch::Tensor& weight,
                                     const torch::Tensor& bias, double eps) {
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("dropout: p must be in [0, 1), got {}", p));
  if (!cpu::add_layer_norm_applies(residual, branch, weight, bias))
    return torch::layer_norm(dropout_add(residual, branch, p, training), {residual.size(-1)},
                             weight, bias, eps);
  return cpu::dropout_add_layer_norm(residual, branch, p, training, weight, bias, eps);
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  MLLM_CHECK(x.defined() && weight.defined() && x.dim() >= 1 && weight.dim() == 1 &&
                 weight.size(0) == x.size(-1),
             "rms_norm: expected weight [d] for x [..., d]");
  if (!cpu::rms_norm_applies(x, weight)) {  // the composition (as transformers' LlamaRMSNorm)
    const torch::Tensor xf = x.to(torch::kFloat);
    const torch::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return normed.to(x.scalar_type()) * weight;
  }
  return cpu::rms_norm(x, weight, eps);
}

}  // namespace mllm
