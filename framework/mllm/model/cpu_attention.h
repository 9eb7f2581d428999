// Attention for bf16 q/k/v on the CPU (bf16 autocast) as one kernel. Forward, per (batch, query
// head) and block of 128 queries: the scores as one oneMKL product with a float32 result
// (cblas_gemm_bf16bf16f32) over the keys the block can see, the mask, softmax and dropout in one
// pass over the rows while they are in cache, and the weighted sum of values as a second product
// written straight into the [batch, seq, d_model] layout the output projection reads. Backward,
// per (batch, query head): the same blocks; with grouped key/value heads each query head's
// contributions to dk and dv kept in float32 and added in head order (the same bits at any
// thread count), then rounded once.
//
// Against the unfused bf16 path (attention.cpp: a bf16 score product with the mask as its bias,
// LibTorch's softmax, dropout, a bf16 product) it skips the head-major copies of q, k and v, the
// broadcast of the mask into every score matrix, the separate passes over the [batch, heads,
// seq, keys] scores and probabilities, and the copy of the output back to [batch, seq, d_model].
// The numbers are more exact: the scores and the probabilities' gradient stay float32 until the
// softmax (not rounded to bf16 first); the probabilities are rounded to bf16 once, as before,
// for the value product and for the backward; and masked scores get exactly zero gradient, as
// masked_fill gives, also in rows where every key is masked (the unfused path's additive mask
// passes the softmax's gradient there). The dropout mask is mllm::dropout's (dropout_bits.h),
// element for element the one the unfused path draws. A score of +inf or NaN at a masked key
// makes its row NaN (the mask is added as -inf), as in the unfused path.
#pragma once

#include <torch/torch.h>

namespace mllm {

// Whether cpu_attention_bf16 runs here: oneMKL's bf16 GEMM is in use (mkl_gemm_bf16bf16f32(),
// bf16_linear.h: a CPU with AMX-BF16, or avx512_bf16 with MLLM_BF16_WEIGHT_GRAD=mkl; never with
// MLLM_BF16_WEIGHT_GRAD=aten).
bool cpu_attention_bf16_available();

// Whether these tensors can take it: q [batch, seq, heads, head_dim], k and v [batch, keys,
// kv_heads, head_dim], all bf16 on the CPU with head_dim even and keys even and positive, heads a
// multiple of kv_heads, and blocked [batch or 1, 1, seq, keys] bool on the CPU.
bool cpu_attention_bf16_applies(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& blocked);

// softmax(q k^T * scale, masked where `blocked`) with dropout p in training, times v:
//   q [batch, seq, heads, head_dim] bf16, k, v [batch, keys, kv_heads, head_dim] bf16 (query
//   head i reads key/value head i / (heads / kv_heads), as Meta's repeat_kv), blocked [batch or
//   1, 1, seq, keys] bool (true = masked; a row with every key masked gets uniform weights, as
//   masked_fill(-1e9) gives in float32) -> [batch, seq, heads * head_dim] bf16, contiguous.
// q, k and v may be strided views (the head dimension dense, heads side by side: the split
// outputs of mllm::linears); other layouts are copied. Differentiable in q, k and v when grad
// mode is on: the gradients are float32 products rounded once to bf16, and masked places get
// zero gradient (as masked_fill); where keys == seq they are views of one bf16 [batch, seq,
// heads + 2 kv_heads, head_dim] buffer, dq, dk, dv side by side in each row (what the Q/K/V
// product's backward reads without a copy: bf16_autocast_linears), else contiguous tensors.
// Keeps the probabilities (bf16 [batch, heads, seq, keys], and their dropped form with dropout)
// for the backward pass, as the unfused path does; with grouped key/value heads the backward
// also takes float32 scratch of [batch, heads, 2, keys, head_dim] (each query head's dk and dv
// before the group's sum: 4 head_dim / seq times the bytes of the probabilities). One draw from the
// default CPU generator per call in training with p > 0 (as mllm::dropout).
// Throws mllm::Error when cpu_attention_bf16_available() or cpu_attention_bf16_applies() is
// false, or for p outside [0, 1).
torch::Tensor cpu_attention_bf16(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const torch::Tensor& blocked, double scale,
                                 double p, bool training);

}  // namespace mllm
