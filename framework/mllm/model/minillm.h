// minillm: the seed document's decoder, exactly as the PyTorch peer baseline
// (shared/peer/ddp_ref.py MiniLLM): learned positions, post-LayerNorm blocks, ReLU feed-forward,
// biases everywhere, untied output head. Parameter names equal the reference's state_dict keys.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/model/attention.h"
#include "mllm/model/model.h"
#include "mllm/model/dropout.h"

namespace mllm {

struct MiniLLMOptions {
  int64_t vocab_size = 0;
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t n_layers = 2;
  int64_t d_ff = 512;          // feed-forward hidden size
  int64_t max_seq_len = 64;    // rows of the learned position table
  double dropout = 0.1;        // embedding and residual dropout (training only)
  double attn_dropout = 0.1;   // on attention probabilities (reference notes; ddp_ref.py has none)
  double norm_eps = 1e-5;      // LayerNorm epsilon (PyTorch default, as the reference)
  double init_std = 0.02;
  std::string attn_impl = "eager";  // model.attn_impl: eager | sdpa | auto

  // From the recipe's model section: d_ff 0 -> 4 * d_model; attn_dropout = model.attn_dropout,
  // or model.dropout when that is null (set it to 0 to train exactly like ddp_ref.py). Throws ConfigError (naming the model.* key) when d_model is
  // not divisible by n_heads, n_kv_heads is set to anything but n_heads, tie_embeddings is set,
  // or vocab_size / max_seq_len < 1.
  static MiniLLMOptions from_config(const ModelConfig& config, int64_t vocab_size,
                                    int64_t max_seq_len);
};

namespace detail {
class MiniLLMFeedForwardImpl : public torch::nn::Module {
 public:
  MiniLLMFeedForwardImpl(int64_t d_model, int64_t d_ff);
  torch::Tensor forward(const torch::Tensor& x);  // fc2(relu(fc1(x)))
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MiniLLMFeedForward);

// x = norm1(x + drop1(attn(x))); x = norm2(x + drop2(ffn(x)))   (post-LN, Vaswani et al. 2017)
class MiniLLMBlockImpl : public torch::nn::Module {
 public:
  explicit MiniLLMBlockImpl(const MiniLLMOptions& o);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& blocked, int64_t offset,
                        torch::Tensor* cache_k, torch::Tensor* cache_v);
  Attention attn{nullptr};
  MiniLLMFeedForward ffn{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Dropout drop1{nullptr}, drop2{nullptr};  // model/dropout.h
};
TORCH_MODULE(MiniLLMBlock);
}  // namespace detail

// x = tok_emb(ids) * sqrt(d_model) + pos_emb(positions); dropout; n_layers post-LN blocks;
// logits = lm_head(x). Parameters (state_dict keys of the reference): tok_emb.weight [V, d],
// pos_emb.weight [max_seq_len, d], layers.N.attn.{q,k,v,o}_proj.{weight,bias},
// layers.N.ffn.fc1.{weight,bias} [d_ff, d], layers.N.ffn.fc2.{weight,bias} [d, d_ff],
// layers.N.norm{1,2}.{weight,bias}, lm_head.{weight,bias} [V, d].
// Count: V d + S d + L (4 (d^2 + d) + 2 d d_ff + d_ff + d + 4 d) + V d + V.
// Init (deterministic given torch::manual_seed): weights and tables ~ normal(0, init_std);
// attn.o_proj and ffn.fc2 weights ~ normal(0, init_std / sqrt(2 n_layers)); biases 0;
// LayerNorm weights 1, biases 0. (The reference keeps PyTorch's module defaults instead.)
class MiniLLM : public LanguageModel {
 public:
  explicit MiniLLM(const MiniLLMOptions& options);

  torch::Tensor forward(const torch::Tensor& tokens) override;
  torch::Tensor forward_cached(const torch::Tensor& tokens, KVCache& cache) override;
  // head_loss (loss.h) over the last hidden states: on the CPU in float32 without logits.
  torch::Tensor forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets) override;
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_seq_len() const override { return options_.max_seq_len; }
  int64_t flops_per_token(int64_t seq_len) const override;
  bool supports_block_hooks() const override { return true; }
  const MiniLLMOptions& options() const { return options_; }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  Dropout drop{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  // tokens [batch, seq] -> the hidden states the head reads [batch, seq, d_model]; with a
  // cache, at positions cache->length.. (which it then advances by seq).
  torch::Tensor hidden(const torch::Tensor& tokens, KVCache* cache);

  MiniLLMOptions options_;
  std::vector<detail::MiniLLMBlock> blocks_;  // the same modules as `layers`, typed
};

}  // namespace mllm
