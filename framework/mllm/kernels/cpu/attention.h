// Attention on the CPU as one kernel, for bf16 q/k/v (bf16 autocast) and for float32 ones.
// Forward, per (batch, query head) and block of 128 queries: the scores as one oneMKL product
// with a float32 result (bf16_gemm_f32() for bf16, sgemm for float32) over the keys the
// block can see, the mask, softmax and dropout in one pass over the rows while they are in
// cache, and the weighted sum of values as a second product written into the [batch, seq,
// d_model] layout the output projection reads. Backward, per (batch, query head): the same
// blocks; with grouped key/value heads each query head's contributions to dk and dv kept in
// float32 and added in head order (the same bits at any thread count), then stored once.
//
// Against the unfused path (attention.cpp: a score product, masked_fill or the mask as a bias,
// LibTorch's softmax, dropout, a product) it skips the head-major copies of q, k and v, the
// mask's pass over every score matrix, the separate passes over the [batch, heads, seq, keys]
// scores and probabilities, and the copy of the output back to [batch, seq, d_model].
// bf16: the numbers are more exact than the unfused bf16 path's: the scores and the
// probabilities' gradient stay float32 until the softmax (not rounded to bf16 first); the
// probabilities are rounded to bf16 once, as before, for the value product and for the
// backward. float32: the unfused float32 path's numbers up to float32 rounding (the scale is
// the product's alpha instead of a division after it; the exponential is Cephes' expf, vec16.h,
// within 2 units in the last place; the row sums in 16 lanes).
// Both: masked scores get exactly zero gradient, as masked_fill gives, also in rows where every
// key is masked (the unfused bf16 path's additive mask passes the softmax's gradient there). The
// dropout mask is mllm::dropout's (dropout_bits.h), element for element the one the unfused path
// draws. A score of +inf or NaN at a masked key makes its row NaN (the mask is added as -inf),
// as in the unfused bf16 path.
#pragma once

#include <torch/torch.h>

namespace mllm {

// Whether cpu_attention runs here for q/k/v of `dtype`: bf16 where mllm's bf16 products run
// (bf16_gemm_f32(), bf16_linear.h: oneMKL's bf16 GEMM on a CPU with AMX-BF16, on one with
// avx512_bf16 where it measured as fast as ATen's, or with MLLM_BF16_GEMM=mkl; float32 sgemm on
// widened operands where the bf16 GEMM is slow or with MLLM_BF16_GEMM=sgemm; never with
// MLLM_BF16_GEMM=aten); float32 where an sgemm_ is found through libtorch_cpu.so (oneMKL's in the
// x86-64 wheels; mkl_gemm.h); no other dtype.
bool cpu_attention_available(torch::ScalarType dtype);

// Whether these tensors can take it: q [batch, seq, heads, head_dim], k and v [batch, keys,
// kv_heads, head_dim], all bf16 or all float32 on the CPU with head_dim even and keys even and
// positive, heads a multiple of kv_heads, and blocked [batch or 1, 1, seq, keys] bool on the CPU.
bool cpu_attention_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& blocked);

// softmax(q k^T * scale, masked where `blocked`) with dropout p in training, times v:
//   q [batch, seq, heads, head_dim], k, v [batch, keys, kv_heads, head_dim], bf16 or float32
//   (query head i reads key/value head i / (heads / kv_heads), as Meta's repeat_kv), blocked
//   [batch or 1, 1, seq, keys] bool (true = masked; a row with every key masked gets uniform
//   weights, as masked_fill(-1e9) gives in float32) -> [batch, seq, heads * head_dim] of q's
//   dtype, contiguous.
// q, k and v may be strided views (the head dimension dense, heads side by side: the split
// outputs of mllm::linears); other layouts are copied. Differentiable in q, k and v when grad
// mode is on: the gradients are float32 products (rounded once for bf16), and masked places get
// zero gradient (as masked_fill); where keys == seq they are views of one [batch, seq, heads +
// 2 kv_heads, head_dim] buffer, dq, dk, dv side by side in each row (what the Q/K/V product's
// backward reads without a copy: mllm::linears), else contiguous tensors.
// Keeps the probabilities ([batch, heads, seq, keys] of q's dtype, and their dropped form with
// dropout) for the backward pass, as the unfused path does; with grouped key/value heads the
// backward also takes float32 scratch of [batch, heads, 2, keys, head_dim] (each query head's
// dk and dv before the group's sum). One draw from the default CPU generator per call in
// training with p > 0 (as mllm::dropout).
// Throws mllm::Error when cpu_attention_available(q's dtype) or cpu_attention_applies() is
// false, or for p outside [0, 1).
torch::Tensor cpu_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& blocked, double scale, double p, bool training);

}  // namespace mllm
