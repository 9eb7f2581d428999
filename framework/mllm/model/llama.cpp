// llama: pre-norm RMSNorm decoder with RoPE, SwiGLU and grouped key/value heads.
#include "mllm/model/llama.h"

#include <string>

#include "mllm/core/error.h"
#include "mllm/model/norm.h"

namespace mllm {

int64_t LlamaOptions::ffn_hidden(int64_t d_model, int64_t multiple_of) {
  const int64_t hidden = 2 * (4 * d_model) / 3;  // int(2 * hidden_dim / 3), hidden_dim = 4 d
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

LlamaOptions LlamaOptions::from_config(const ModelConfig& c, int64_t vocab_size,
                                       int64_t max_seq_len) {
  if (vocab_size < 1)
    throw ConfigError("model (llama): vocabulary size must be >= 1, got " +
                      std::to_string(vocab_size));
  if (max_seq_len < 1)
    throw ConfigError("model.max_seq_len: llama needs >= 1 positions, got " +
                      std::to_string(max_seq_len));
  if (c.n_heads < 1 || c.d_model % c.n_heads != 0)
    throw ConfigError("model.n_heads: d_model=" + std::to_string(c.d_model) +
                      " must be divisible by n_heads=" + std::to_string(c.n_heads));
  if ((c.d_model / c.n_heads) % 2 != 0)
    throw ConfigError("model.n_heads: llama's head size d_model/n_heads=" +
                      std::to_string(c.d_model / c.n_heads) +
                      " must be even (rotary embeddings rotate pairs of dimensions)");
  const int64_t kv = c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads;
  if (c.n_heads % kv != 0)
    throw ConfigError("model.n_kv_heads=" + std::to_string(kv) + " must divide model.n_heads=" +
                      std::to_string(c.n_heads));
  LlamaOptions o;
  o.vocab_size = vocab_size;
  o.d_model = c.d_model;
  o.n_heads = c.n_heads;
  o.n_kv_heads = kv;
  o.n_layers = c.n_layers;
  o.d_ff = c.d_ff > 0 ? c.d_ff : ffn_hidden(c.d_model, c.multiple_of);
  o.max_seq_len = max_seq_len;
  o.dropout = c.dropout;
  o.attn_dropout = c.attn_dropout.value_or(c.dropout);
  o.rope_theta = c.rope_theta;
  o.norm_eps = c.norm_eps;
  o.tie_embeddings = c.tie_embeddings;
  o.init_std = c.init_std;
  o.attn_impl = c.attn_impl;
  return o;
}

namespace detail {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps_); }

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t hidden) {
  namespace nn = torch::nn;
  gate_proj = register_module("gate_proj", nn::Linear(nn::LinearOptions(d_model, hidden).bias(false)));
  up_proj = register_module("up_proj", nn::Linear(nn::LinearOptions(d_model, hidden).bias(false)));
  down_proj = register_module("down_proj", nn::Linear(nn::LinearOptions(hidden, d_model).bias(false)));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  const auto gate_up = linears({gate_proj, up_proj}, x);
  return linear(down_proj, torch::silu(gate_up[0]) * gate_up[1]);
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaOptions& o) {
  attn_norm = register_module("attn_norm", RMSNorm(o.d_model, o.norm_eps));
  AttentionOptions a;
  a.d_model = o.d_model;
  a.n_heads = o.n_heads;
  a.n_kv_heads = o.n_kv_heads;
  a.bias = false;
  a.attn_dropout = o.attn_dropout;
  a.impl = o.attn_impl;
  attn = register_module("attn", Attention(a));
  ffn_norm = register_module("ffn_norm", RMSNorm(o.d_model, o.norm_eps));
  ffn = register_module("ffn", SwiGLU(o.d_model, o.d_ff));
  drop1 = register_module("drop1", Dropout(o.dropout));
  drop2 = register_module("drop2", Dropout(o.dropout));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& blocked,
                                      const Rotary& rope, int64_t offset, torch::Tensor* cache_k,
                                      torch::Tensor* cache_v) {
  auto h = drop1->add_to(x, attn(attn_norm(x), blocked, &rope, offset, cache_k, cache_v));
  return drop2->add_to(h, ffn(ffn_norm(h)));
}

}  // namespace detail

Llama::Llama(const LlamaOptions& o)
    : options_(o) {
  MLLM_CHECK(o.vocab_size > 0 && o.max_seq_len > 0 && o.n_layers > 0, "bad LlamaOptions");
  rope_ = register_module("rope", std::make_shared<Rotary>(o.d_model / o.n_heads, o.max_seq_len,
                                                          o.rope_theta));
  tok_emb = register_module("tok_emb", torch::nn::Embedding(o.vocab_size, o.d_model));
  drop = register_module("drop", Dropout(o.dropout));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layers; ++i) {
    blocks_.emplace_back(o);
    layers->push_back(blocks_.back());
  }
  norm = register_module("norm", detail::RMSNorm(o.d_model, o.norm_eps));
  if (!o.tie_embeddings) {
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.vocab_size).bias(false)));
  }
  init_weights(*this, o.init_std, o.n_layers,
                       {"attn.o_proj.weight", "ffn.down_proj.weight"});
}

// Under bf16 autocast the logits are bf16: lm_loss_sum works on them in float32.
torch::Tensor Llama::forward(const torch::Tensor& tokens) {
  return logits(hidden(tokens, nullptr));
}

torch::Tensor Llama::forward_cached(const torch::Tensor& tokens, KVCache& cache) {
  return logits(hidden(tokens, &cache));
}

torch::Tensor Llama::logits(const torch::Tensor& x) {
  return options_.tie_embeddings ? linear(x, tok_emb->weight, torch::Tensor())
                                 : linear(lm_head, x);
}

torch::Tensor Llama::forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  const torch::Tensor x = hidden(tokens, nullptr);
  return options_.tie_embeddings ? head_loss(x, tok_emb->weight, torch::Tensor(), targets)
                                 : head_loss(lm_head, x, targets);
}

torch::Tensor Llama::hidden(const torch::Tensor& tokens, KVCache* cache) {
  const int64_t offset = cache != nullptr ? cache->length : 0;
  check_tokens(tokens, offset, options_.max_seq_len,
                       cache != nullptr ? "llama forward_cached" : "llama forward");
  const int64_t t = tokens.size(1);
  auto key_pad = cache != nullptr ? extend_key_pad(*cache, tokens, options_.n_layers)
                                  : tokens.eq(kPadId);
  auto blocked = attention_mask(key_pad, t, offset,
                                        uses_sdpa(options_.attn_impl, tokens.device()));
  auto x = drop(tok_emb(tokens));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (cache != nullptr) {
      x = blocks_[l]->forward(x, blocked, *rope_, offset, &cache->k[l], &cache->v[l]);
      continue;
    }
    x = run_block(int64_t(l), x, [block = blocks_[l], blocked, rope = rope_](const torch::Tensor& in) mutable {
      return block->forward(in, blocked, *rope, 0, nullptr, nullptr);
    });
  }
  if (cache != nullptr) cache->length += t;
  return norm(x);
}

int64_t Llama::flops_per_token(int64_t seq_len) const {
  const int64_t table = tok_emb->weight.numel();
  const int64_t matmul_params = num_params() - table + (options_.tie_embeddings ? table : 0);
  return 6 * matmul_params + 12 * options_.n_layers * options_.d_model * seq_len;
}

}  // namespace mllm
