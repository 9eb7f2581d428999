// Scaled dot-product attention, the op: the path chosen per call (kernels/attention.h).
#include "mllm/kernels/attention.h"

#include <cstdint>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/attention.h"

namespace mllm {

bool uses_sdpa(const std::string& impl, const torch::Device& device) {
  return impl == "sdpa" || (impl == "auto" && device.is_cuda());
}

AttentionPath attention_path(const std::string& impl, const torch::Tensor& q,
                             const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& blocked, bool cached) {
  const bool sdpa = uses_sdpa(impl, q.device());
  // bf16 or float32 q/k/v on the CPU where oneMKL's product for them is in use, without a KV
  // cache: the fused kernel (the same attention in one pass per head; bf16 about 2x faster per
  // layer and more exact, float32 the same numbers to float32 rounding).
  if (!cached && !sdpa && blocked.defined() && cpu_attention_available(q.scalar_type()) &&
      cpu_attention_applies(q, k, v, blocked))
    return AttentionPath::kCpuFused;
  return sdpa ? AttentionPath::kSdpa : AttentionPath::kEager;
}

torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& blocked, double scale,
                              double p, bool training) {
  return cpu_attention(q, k, v, blocked, scale, p, training);
}

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& blocked, double p) {
  if (!blocked.defined()) {
    MLLM_CHECK(q.size(2) == k.size(2), "attention: a causal call without mask needs no cache");
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
  }
  // Additive, as eager's masked_fill(-1e9): rows with every key masked stay finite.
  return at::scaled_dot_product_attention(q, k, v, additive_mask(blocked, q.scalar_type()), p,
                                          /*is_causal=*/false);
}

torch::Tensor additive_mask(const torch::Tensor& blocked, torch::ScalarType dtype) {
  auto build = [&] {
    auto bias = torch::zeros(blocked.sizes(), blocked.options().dtype(dtype));
    return bias.masked_fill_(blocked, -1e9);
  };
  if (!blocked.is_cpu()) return build();
  thread_local torch::Tensor last_mask, last_bias;
  thread_local int64_t last_version = -1;
  if (last_mask.defined() && last_mask.is_same(blocked) && last_bias.scalar_type() == dtype &&
      static_cast<int64_t>(blocked._version()) == last_version)
    return last_bias;
  last_mask = blocked;
  last_version = static_cast<int64_t>(blocked._version());
  last_bias = build();
  return last_bias;
}

}  // namespace mllm
