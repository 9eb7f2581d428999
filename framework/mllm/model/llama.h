// llama: a LLaMA-2-style decoder (Touvron et al. 2023; the Happy-LLM tutorial's model, after
// Meta's llama / llama2.c): pre-norm RMSNorm, rotary positions, SwiGLU feed-forward, grouped
// key/value heads, no biases, final RMSNorm, optionally tied input/output embeddings.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/model/attention.h"
#include "mllm/model/model.h"
#include "mllm/model/dropout.h"

namespace mllm {

struct LlamaOptions {
  int64_t vocab_size = 0;
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;      // divides n_heads
  int64_t n_layers = 2;
  int64_t d_ff = 352;          // SwiGLU hidden size
  int64_t max_seq_len = 64;
  double dropout = 0.1;        // embedding and residual dropout
  double attn_dropout = 0.1;   // attention-probability dropout (model.attn_dropout, null = dropout)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;      // RMSNorm epsilon
  bool tie_embeddings = false;
  double init_std = 0.02;
  std::string attn_impl = "eager";  // model.attn_impl: eager | sdpa | auto

  // The LLaMA SwiGLU hidden size (Meta llama model.py FeedForward, llama2.c):
  // multiple_of * ceil(floor(2 * 4 d_model / 3) / multiple_of). E.g. d 128, 32 -> 352.
  static int64_t ffn_hidden(int64_t d_model, int64_t multiple_of);

  // From the recipe's model section: n_kv_heads 0 -> n_heads, d_ff 0 -> ffn_hidden(d_model,
  // multiple_of). Throws ConfigError (naming the model.* key) when d_model is not divisible by
  // n_heads, the head size is odd (RoPE rotates pairs), n_kv_heads does not divide n_heads,
  // or vocab_size / max_seq_len < 1.
  static LlamaOptions from_config(const ModelConfig& config, int64_t vocab_size,
                                  int64_t max_seq_len);
};

namespace detail {
// y = x / sqrt(mean(x^2) + eps) * weight, normalised in float32 then cast back to x's dtype
// before the weight (Zhang & Sennrich 2019; as Meta's RMSNorm); mllm::rms_norm (kernels/norm.h: one
// pass per row in CPU float32). Parameter: weight [dim].
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// down_proj(silu(gate_proj(x)) * up_proj(x))   (Shazeer 2020, "GLU Variants")
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d_model, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGLU);

// x = x + drop1(attn(attn_norm(x))); x = x + drop2(ffn(ffn_norm(x)))   (pre-norm)
class LlamaBlockImpl : public torch::nn::Module {
 public:
  explicit LlamaBlockImpl(const LlamaOptions& o);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& blocked, const Rotary& rope,
                        int64_t offset, torch::Tensor* cache_k, torch::Tensor* cache_v);
  RMSNorm attn_norm{nullptr}, ffn_norm{nullptr};
  Attention attn{nullptr};
  SwiGLU ffn{nullptr};
  Dropout drop1{nullptr}, drop2{nullptr};  // model/dropout.h
};
TORCH_MODULE(LlamaBlock);
}  // namespace detail

// x = dropout(tok_emb(ids)); n_layers pre-norm blocks; logits = head(norm(x)), where head is
// lm_head, or the token table itself (x tok_emb.weight^T) when tie_embeddings.
// Parameters: tok_emb.weight [V, d], layers.N.attn_norm.weight, layers.N.attn.q_proj.weight
// [d, d], layers.N.attn.{k,v}_proj.weight [kv, d] (kv = n_kv_heads * d / n_heads),
// layers.N.attn.o_proj.weight [d, d], layers.N.ffn_norm.weight,
// layers.N.ffn.{gate,up}_proj.weight [d_ff, d], layers.N.ffn.down_proj.weight [d, d_ff],
// norm.weight [d], lm_head.weight [V, d] (untied only).
// Count: V d + L (2 d^2 + 2 d kv + 3 d d_ff + 2 d) + d + (tied ? 0 : V d).
// Init (deterministic given torch::manual_seed): weights and the token table ~ normal(0,
// init_std); attn.o_proj and ffn.down_proj weights ~ normal(0, init_std / sqrt(2 n_layers));
// RMSNorm weights 1.
class Llama : public LanguageModel {
 public:
  explicit Llama(const LlamaOptions& options);

  torch::Tensor forward(const torch::Tensor& tokens) override;
  torch::Tensor forward_cached(const torch::Tensor& tokens, KVCache& cache) override;
  // head_loss (loss.h) over the last hidden states: on the CPU in float32 without logits.
  torch::Tensor forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets) override;
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_seq_len() const override { return options_.max_seq_len; }
  // N counts every parameter except the token table, plus V d for the head when it is tied.
  int64_t flops_per_token(int64_t seq_len) const override;
  bool supports_block_hooks() const override { return true; }
  const LlamaOptions& options() const { return options_; }

  torch::nn::Embedding tok_emb{nullptr};
  Dropout drop{nullptr};
  torch::nn::ModuleList layers{nullptr};
  detail::RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_embeddings

 private:
  // tokens [batch, seq] -> the hidden states the head reads [batch, seq, d_model]; with a
  // cache, at positions cache->length.. (which it then advances by seq).
  torch::Tensor hidden(const torch::Tensor& tokens, KVCache* cache);
  // hidden states [batch, seq, d_model] -> logits [batch, seq, vocab]: the tied embedding's
  // weight (torch::linear) or lm_head (mllm::linear).
  torch::Tensor logits(const torch::Tensor& x);

  LlamaOptions options_;
  std::shared_ptr<Rotary> rope_;  // submodule "rope" (buffers only, not in checkpoints)
  std::vector<detail::LlamaBlock> blocks_;  // the same modules as `layers`, typed
};

}  // namespace mllm
