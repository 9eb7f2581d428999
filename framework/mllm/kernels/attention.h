// Scaled dot-product attention, the op (Vaswani et al. 2017, "Attention Is All You Need", Sec.
// 3.2.1): softmax(q k^T / sqrt(d_k), masked) v, with dropout on the probabilities in training.
// Three paths; attention_path() is the one place that chooses among them:
//   kCpuFused: mllm's CPU kernel (kernels/cpu/attention.h) for bf16 (autocast) or float32 q/k/v
//     where mllm's products for that dtype run, a mask given and no KV cache: one pass per head,
//     the same dropout mask as mllm::dropout. Agreement with eager: bf16 more exact (float32
//     scores and probability gradients); float32 eager's values to float32 rounding
//     (docs/precision.md).
//   kSdpa: LibTorch's scaled_dot_product_attention (flash / memory-efficient kernels on CUDA),
//     where model.attn_impl is sdpa, or auto on CUDA: same scale; no mask = plain causal
//     attention (is_causal); a mask added as a -1e9 bias, so masked rows behave as in eager.
//     Agrees with eager to float rounding; its dropout draws other random numbers.
//   kEager: the reference computation, written out in the model where a reader finds it
//     (model/attention.cpp: scores, the causal and padding mask, softmax in float32, dropout,
//     the weighted sum of values): what the other two are tested against.
#pragma once

#include <torch/torch.h>

#include <string>

namespace mllm {

enum class AttentionPath { kCpuFused, kSdpa, kEager };

// Whether attention runs through scaled_dot_product_attention for tensors on `device`: impl
// "sdpa" always, "auto" on CUDA, "eager" never (model.attn_impl).
bool uses_sdpa(const std::string& impl, const torch::Device& device);

// The path for one call: q [batch, seq, heads, head_dim], k and v [batch, keys, kv_heads,
// head_dim] (before the heads are moved to dimension 1), blocked [batch or 1, 1, seq, keys] bool
// or undefined (sdpa's plain causal attention), impl as uses_sdpa, `cached` when a KV cache
// takes part (decoding: never the fused kernel).
AttentionPath attention_path(const std::string& impl, const torch::Tensor& q,
                             const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& blocked, bool cached);

// kCpuFused: cpu_attention(q, k, v, blocked, scale, p, training) (kernels/cpu/attention.h for
// shapes, gradients and errors) -> [batch, seq, heads * head_dim] of q's dtype.
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& blocked, double scale,
                              double p, bool training);

// kSdpa: q [batch, heads, seq, head_dim], k and v [batch, heads, keys, head_dim] (key/value heads
// already repeated), blocked [batch or 1, 1, seq, keys] bool or undefined (causal: needs
// keys == seq), dropout p (0 outside training) -> [batch, heads, seq, head_dim]. Scale 1 /
// sqrt(head_dim). Throws mllm::Error for an undefined mask with keys != seq.
torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& blocked, double p);

// `blocked` [batch or 1, 1, seq, keys] bool as a bias of `dtype`: 0 where allowed, -1e9 where
// blocked. The blocks of one forward pass share one mask: on the CPU the bias of the last mask
// asked for is kept (with the mask, so that its storage is not reused while the entry lives,
// and the mask's version, so that an in-place change is seen) and served again for the same
// mask, once per forward instead of once per block. (No cache for device tensors: a
// thread_local one would outlive the device's allocator at exit.) Used by eager attention on
// bf16 scores and by sdpa's attn_mask.
torch::Tensor additive_mask(const torch::Tensor& blocked, torch::ScalarType dtype);

}  // namespace mllm
