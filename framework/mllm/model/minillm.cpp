// minillm: the reference MiniLLM (post-LN, learned positions, ReLU FFN, untied head).
#include "mllm/model/minillm.h"

#include <cmath>
#include <string>

#include "mllm/core/error.h"
#include "mllm/model/norm.h"

namespace mllm {

MiniLLMOptions MiniLLMOptions::from_config(const ModelConfig& c, int64_t vocab_size,
                                           int64_t max_seq_len) {
  if (vocab_size < 1)
    throw ConfigError("model (minillm): vocabulary size must be >= 1, got " +
                      std::to_string(vocab_size));
  if (max_seq_len < 1)
    throw ConfigError("model.max_seq_len: minillm needs >= 1 positions, got " +
                      std::to_string(max_seq_len));
  if (c.n_heads < 1 || c.d_model % c.n_heads != 0)
    throw ConfigError("model.n_heads: d_model=" + std::to_string(c.d_model) +
                      " must be divisible by n_heads=" + std::to_string(c.n_heads));
  if (c.n_kv_heads != 0 && c.n_kv_heads != c.n_heads)
    throw ConfigError("model.n_kv_heads: minillm has one key/value head per query head; remove "
                      "the key or use model.type=llama for grouped key/value heads");
  if (c.tie_embeddings)
    throw ConfigError("model.tie_embeddings: minillm's output head is untied (as the reference); "
                      "remove the key or use model.type=llama");
  MiniLLMOptions o;
  o.vocab_size = vocab_size;
  o.d_model = c.d_model;
  o.n_heads = c.n_heads;
  o.n_layers = c.n_layers;
  o.d_ff = c.d_ff > 0 ? c.d_ff : 4 * c.d_model;
  o.max_seq_len = max_seq_len;
  o.dropout = c.dropout;
  o.attn_dropout = c.attn_dropout.value_or(c.dropout);
  o.norm_eps = c.norm_eps;
  o.init_std = c.init_std;
  o.attn_impl = c.attn_impl;
  return o;
}

namespace detail {

MiniLLMFeedForwardImpl::MiniLLMFeedForwardImpl(int64_t d_model, int64_t d_ff) {
  fc1 = register_module("fc1", torch::nn::Linear(d_model, d_ff));
  fc2 = register_module("fc2", torch::nn::Linear(d_ff, d_model));
}

torch::Tensor MiniLLMFeedForwardImpl::forward(const torch::Tensor& x) {
  return linear(fc2, linear_relu(fc1, x));
}

MiniLLMBlockImpl::MiniLLMBlockImpl(const MiniLLMOptions& o) {
  AttentionOptions a;
  a.d_model = o.d_model;
  a.n_heads = o.n_heads;
  a.n_kv_heads = o.n_heads;
  a.bias = true;
  a.attn_dropout = o.attn_dropout;
  a.impl = o.attn_impl;
  attn = register_module("attn", Attention(a));
  ffn = register_module("ffn", MiniLLMFeedForward(o.d_model, o.d_ff));
  const auto ln = torch::nn::LayerNormOptions({o.d_model}).eps(o.norm_eps);
  norm1 = register_module("norm1", torch::nn::LayerNorm(ln));
  norm2 = register_module("norm2", torch::nn::LayerNorm(ln));
  drop1 = register_module("drop1", Dropout(o.dropout));
  drop2 = register_module("drop2", Dropout(o.dropout));
}

torch::Tensor MiniLLMBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& blocked,
                                        int64_t offset, torch::Tensor* cache_k,
                                        torch::Tensor* cache_v) {
  // norm(x + drop(branch)): on the CPU in float32 one pass per row (kernels/norm.h).
  auto h = dropout_add_layer_norm(x, attn(x, blocked, nullptr, offset, cache_k, cache_v), *drop1,
                                  *norm1);
  return dropout_add_layer_norm(h, ffn(h), *drop2, *norm2);
}

}  // namespace detail

MiniLLM::MiniLLM(const MiniLLMOptions& o) : options_(o) {
  MLLM_CHECK(o.vocab_size > 0 && o.max_seq_len > 0 && o.n_layers > 0, "bad MiniLLMOptions");
  tok_emb = register_module("tok_emb", torch::nn::Embedding(o.vocab_size, o.d_model));
  pos_emb = register_module("pos_emb", torch::nn::Embedding(o.max_seq_len, o.d_model));
  drop = register_module("drop", Dropout(o.dropout));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layers; ++i) {
    blocks_.emplace_back(o);
    layers->push_back(blocks_.back());
  }
  lm_head = register_module("lm_head", torch::nn::Linear(o.d_model, o.vocab_size));
  init_weights(*this, o.init_std, o.n_layers, {"attn.o_proj.weight", "ffn.fc2.weight"});
}

// Under bf16 autocast the logits are bf16: lm_loss_sum works on them in float32.
torch::Tensor MiniLLM::forward(const torch::Tensor& tokens) {
  return linear(lm_head, hidden(tokens, nullptr));
}

torch::Tensor MiniLLM::forward_cached(const torch::Tensor& tokens, KVCache& cache) {
  return linear(lm_head, hidden(tokens, &cache));
}

torch::Tensor MiniLLM::forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  return head_loss(lm_head, hidden(tokens, nullptr), targets);
}

torch::Tensor MiniLLM::hidden(const torch::Tensor& tokens, KVCache* cache) {
  const int64_t offset = cache != nullptr ? cache->length : 0;
  check_tokens(tokens, offset, options_.max_seq_len,
                       cache != nullptr ? "minillm forward_cached" : "minillm forward");
  const int64_t t = tokens.size(1);
  auto key_pad = cache != nullptr ? extend_key_pad(*cache, tokens, options_.n_layers)
                                  : tokens.eq(kPadId);
  auto blocked = attention_mask(key_pad, t, offset,
                                        uses_sdpa(options_.attn_impl, tokens.device()));
  auto positions = torch::arange(offset, offset + t, tokens.options());
  auto x = tok_emb(tokens) * std::sqrt(static_cast<double>(options_.d_model)) + pos_emb(positions);
  x = drop(x);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (cache != nullptr) {
      x = blocks_[l]->forward(x, blocked, offset, &cache->k[l], &cache->v[l]);
      continue;
    }
    x = run_block(int64_t(l), x, [block = blocks_[l], blocked](const torch::Tensor& in) mutable {
      return block->forward(in, blocked, 0, nullptr, nullptr);
    });
  }
  if (cache != nullptr) cache->length += t;
  return x;
}

int64_t MiniLLM::flops_per_token(int64_t seq_len) const {
  const int64_t tables = tok_emb->weight.numel() + pos_emb->weight.numel();
  return 6 * (num_params() - tables) + 12 * options_.n_layers * options_.d_model * seq_len;
}

}  // namespace mllm
