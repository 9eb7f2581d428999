// The linear layer, the op: the path chosen per call (kernels/linear.h).
#include "mllm/kernels/linear.h"

#include <ATen/autocast_mode.h>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/kernels/cpu/f32_linear.h"

namespace mllm {

namespace {
// Path 1 (kernels/linear.h): CPU bf16 autocast with mllm's bf16 products, a float32 weight; in
// training, and outside grad mode (so that evaluation and a checkpointed block's first pass
// compute what training does).
bool bf16_own_linear(const torch::Tensor& weight, const torch::Tensor& x) {
  return x.is_cpu() && weight.is_cpu() && weight.scalar_type() == torch::kFloat &&
         at::autocast::is_autocast_enabled(at::kCPU) &&
         at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16 && bf16_products_in_mllm();
}
}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (bf16_own_linear(weight, x)) return bf16_autocast_linear(x, weight, bias);
  if (f32_cpu_linear(x, weight)) return f32_linear(x, weight, bias);
  return torch::linear(x, weight, bias);
}

torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias) {
  if (bf16_own_linear(weight, x)) return bf16_autocast_linear(x, weight, bias, /*relu=*/true);
  if (f32_cpu_linear(x, weight)) return f32_linear(x, weight, bias, /*relu=*/true);
  return torch::relu(torch::linear(x, weight, bias));
}

std::vector<torch::Tensor> linears(const torch::Tensor& x,
                                   const std::vector<torch::Tensor>& weights,
                                   const std::vector<torch::Tensor>& biases) {
  MLLM_CHECK(biases.size() == weights.size(),
             "linears: one bias (or an undefined tensor) per weight");
  // One product takes them when every layer has a bias or none, all have one in-features and
  // all are on the same fused path (bf16 training, or float32 on the CPU).
  bool uniform = !weights.empty(), bf16 = uniform, f32 = uniform;
  std::vector<torch::Tensor> defined_biases;
  for (size_t i = 0; i < weights.size(); ++i) {
    uniform = uniform && biases[i].defined() == biases[0].defined() &&
              weights[i].size(1) == weights[0].size(1);
    bf16 = bf16 && bf16_own_linear(weights[i], x);
    f32 = f32 && f32_cpu_linear(x, weights[i]);
    if (biases[i].defined()) defined_biases.push_back(biases[i]);
  }
  if (uniform && bf16) return bf16_autocast_linears(x, weights, defined_biases);
  if (uniform && f32) return f32_linears(x, weights, defined_biases);
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < weights.size(); ++i) out.push_back(linear(x, weights[i], biases[i]));
  return out;
}

}  // namespace mllm
