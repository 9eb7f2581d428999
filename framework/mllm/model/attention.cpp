// Multi-head / grouped-query causal self-attention and rotary position embeddings.
#include "mllm/model/attention.h"

#include <cmath>
#include <string>

#include "mllm/core/error.h"
#include "mllm/kernels/attention.h"
#include "mllm/model/model.h"

namespace mllm {

Rotary::Rotary(int64_t head_dim, int64_t max_seq_len, double theta) {
  MLLM_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary head_dim must be even");
  // Same float32 arithmetic as Meta's precompute_freqs_cis, so tables agree to the last bit
  // or two with the PyTorch reference.
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) /
                   static_cast<double>(head_dim);
  auto inv_freq = 1.0 / torch::pow(theta, exponents);                    // [head_dim/2]
  auto pos = torch::arange(max_seq_len, torch::kFloat);                  // [max_seq_len]
  auto angles = torch::outer(pos, inv_freq);                             // [max_seq_len, hd/2]
  cos_ = register_buffer("cos", torch::cos(angles));
  sin_ = register_buffer("sin", torch::sin(angles));
}

torch::Tensor Rotary::apply(const torch::Tensor& x, int64_t offset) const {
  const int64_t seq = x.size(1);
  if (offset + seq > cos_.size(0))
    throw Error("rotary embedding: positions up to " + std::to_string(offset + seq - 1) +
                " requested but the model supports max_seq_len=" + std::to_string(cos_.size(0)));
  const auto dev = x.device();
  // [seq, 1, hd/2]: broadcast over batch and heads of x [batch, seq, heads, head_dim]. The .to()
  // is a no-op once the module lives on x's device (Llama moves it with its parameters).
  auto cos = cos_.narrow(0, offset, seq).to(dev).unsqueeze(1);
  auto sin = sin_.narrow(0, offset, seq).to(dev).unsqueeze(1);
  auto pairs = x.to(torch::kFloat).reshape({x.size(0), seq, x.size(2), x.size(3) / 2, 2});
  auto x0 = pairs.select(-1, 0);
  auto x1 = pairs.select(-1, 1);
  auto out = torch::stack({x0 * cos - x1 * sin, x0 * sin + x1 * cos}, -1).flatten(-2);
  return out.to(x.scalar_type());
}

AttentionImpl::AttentionImpl(const AttentionOptions& options)
    : options_(options), head_dim_(options.d_model / options.n_heads) {
  MLLM_CHECK(options.n_heads > 0 && options.d_model % options.n_heads == 0,
             "attention: d_model must be divisible by n_heads");
  MLLM_CHECK(options.n_kv_heads > 0 && options.n_heads % options.n_kv_heads == 0,
             "attention: n_kv_heads must divide n_heads");
  MLLM_CHECK(options.impl == "eager" || options.impl == "sdpa" || options.impl == "auto",
             "attention: impl must be eager, sdpa or auto, not '" + options.impl + "'");
  const int64_t d = options.d_model, kv = options.n_kv_heads * head_dim_;
  namespace nn = torch::nn;
  q_proj = register_module("q_proj", nn::Linear(nn::LinearOptions(d, d).bias(options.bias)));
  k_proj = register_module("k_proj", nn::Linear(nn::LinearOptions(d, kv).bias(options.bias)));
  v_proj = register_module("v_proj", nn::Linear(nn::LinearOptions(d, kv).bias(options.bias)));
  o_proj = register_module("o_proj", nn::Linear(nn::LinearOptions(d, d).bias(options.bias)));
  attn_drop_ = register_module("attn_drop", Dropout(options.attn_dropout));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& blocked,
                                     const Rotary* rope, int64_t offset, torch::Tensor* cache_k,
                                     torch::Tensor* cache_v) {
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t h = options_.n_heads, kvh = options_.n_kv_heads, hd = head_dim_;
  const auto qkv = linears({q_proj, k_proj, v_proj}, x);
  auto q = qkv[0].view({b, t, h, hd});
  auto k = qkv[1].view({b, t, kvh, hd});
  auto v = qkv[2].view({b, t, kvh, hd});
  if (rope != nullptr) {
    q = rope->apply(q, offset);
    k = rope->apply(k, offset);
  }
  // Which path computes it (kernels/attention.h): mllm's fused CPU kernel, LibTorch's sdpa, or
  // the eager computation below.
  const AttentionPath path = attention_path(options_.impl, q, k, v, blocked, cache_k != nullptr);
  if (path == AttentionPath::kCpuFused) {
    const auto out = fused_attention(q, k, v, blocked, 1.0 / std::sqrt(static_cast<double>(hd)),
                                     options_.attn_dropout, is_training());
    return linear(o_proj, out);
  }
  v = v.transpose(1, 2);
  q = q.transpose(1, 2);  // [b, h, t, hd]
  k = k.transpose(1, 2);  // [b, kvh, t, hd]
  if (cache_k != nullptr) {
    if (cache_k->defined()) {
      k = torch::cat({*cache_k, k}, 2);
      v = torch::cat({*cache_v, v}, 2);
    }
    *cache_k = k;
    *cache_v = v;
  }
  if (kvh != h) {
    k = k.repeat_interleave(h / kvh, 1);
    v = v.repeat_interleave(h / kvh, 1);
  }
  if (path == AttentionPath::kSdpa) {
    const double p = is_training() ? options_.attn_dropout : 0.0;
    const auto out = sdpa_attention(q, k, v, blocked, p);
    return linear(o_proj, out.transpose(1, 2).reshape({b, t, h * hd}));
  }
  // Eager: the reference computation (the PyTorch reference and the study notes' MiniLLM).
  MLLM_CHECK(blocked.defined(), "attention: eager attention needs the mask");
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  torch::Tensor scores;
  if (q.scalar_type() == torch::kFloat) {
    // float32: scores / sqrt(head_dim) after the product, as the PyTorch reference (bit for bit).
    scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  } else {
    // bf16 (autocast): the scale on q, [b, h, t, hd], before the product instead of on the
    // [b, h, t, keys] scores after it: a quarter of the traffic at head_dim 64 and keys 256, and
    // one bf16 rounding instead of two (none on q when head_dim is a power of 4).
    //
    // The mask as an additive bias, 0 or -1e9 (bf16(-1e9) = -999,817,216): the sum equals
    // masked_fill's result bit for bit (|score| is far below half an ulp of 1e9 in bf16, 2^22),
    // and it needs no backward pass of its own (masked_fill's kernel is a per-element loop, and
    // its backward another one over [b, h, t, keys] plus a copy). The gradient it lets through
    // at masked places is the softmax's there, exactly 0, except in a row where every key is
    // masked (a padding query), whose output no loss reads. A mask shared by the batch (no
    // padding: training's packed rows) enters the product itself, as baddbmm's C = bias +
    // q k^T: the same bits as the rounded product plus the bias (the sum is either the rounded
    // score or bf16(-1e9)), without a separate add pass over [b, h, t, keys].
    //
    // With baddbmm, k is gathered head-major as [b * h, keys, hd] (the copy q gets too) and
    // read transposed by the GEMM, rather than gathered transposed; and a power-of-two scale
    // (head_dim a power of 4) is the GEMM's alpha: exact either way, so the same bits, without
    // a pass over q (forward and backward).
    const auto bias = additive_mask(blocked, q.scalar_type());
    if (bias.size(0) == 1) {
      const int64_t bh = q.size(0) * q.size(1), queries = q.size(2), keys = k.size(2);
      int exponent = 0;
      const bool power_of_two = std::frexp(scale, &exponent) == 0.5;
      scores = at::baddbmm(bias.view({1, queries, keys}),
                           (power_of_two ? q : q * scale).reshape({bh, queries, hd}),
                           k.reshape({bh, keys, hd}).transpose(1, 2), /*beta=*/1,
                           /*alpha=*/power_of_two ? scale : 1.0)
                   .view({q.size(0), q.size(1), queries, keys});
    } else {
      scores = torch::matmul(q * scale, k.transpose(-2, -1));
      scores.add_(bias);
    }
  }
  // float32 scores: float32 softmax, -1e9 rather than -inf keeps all-masked rows finite
  // (uniform), exactly as the PyTorch reference. (In place: `scores` is a fresh tensor here
  // that autograd does not keep.) bf16 scores (autocast) stay bf16: LibTorch's softmax kernels
  // accumulate in float32 internally (max, sum of exp, and the backward's sum of gradient x
  // output) and round the result once, which equals the float32 softmax rounded to bf16 — what
  // the float32 path fed to the bf16 product anyway. The backward's error against float64 is
  // 2.3e-3 relative, against 1.7e-3 for a float32 backward rounded to bf16
  // (docs/precision.md); the float32 copies of [b, h, t, keys] and their casts are gone.
  if (scores.scalar_type() != torch::kBFloat16) scores.masked_fill_(blocked, -1e9);
  // Softmax, then dropout (with bf16 scores in training, one fused backward: softmax_dropout).
  auto attn = options_.attn_dropout > 0 && scores.scalar_type() == torch::kBFloat16
                  ? attn_drop_->of_softmax(scores)
                  : torch::softmax(scores, -1);
  if (options_.attn_dropout > 0 && scores.scalar_type() != torch::kBFloat16)
    attn = attn_drop_(attn);
  auto out = torch::matmul(attn, v);  // [b, h, t, hd]
  return linear(o_proj, out.transpose(1, 2).reshape({b, t, h * hd}));
}

}  // namespace mllm
