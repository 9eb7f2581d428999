// The language-model interface every model family implements, its KV cache, and the model
// registry (`model.type` in the recipe: minillm, llama; plugins may add more).
// Families live in minillm.h / llama.h; the shared attention code in attention.h. The ops they
// compute with (linear layers, attention, norms, dropout, the loss) are in kernels/, one header
// per op family with its device paths.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"

#include "mllm/core/special_tokens.h"
#include "mllm/kernels/linear.h"
#include "mllm/model/activation_checkpoint.h"
#include "mllm/model/loss.h"

namespace mllm {

// Callbacks around every transformer block of LanguageModel::forward (ZeRO stage 3 gathers a
// block's sharded parameters in them; see distributed/data_parallel.h). `layer` is the 0-based
// block index. before_forward(l) runs before block l computes, after_forward(l) after it
// returned (its output is computed; tensors it saved for backward still point at the block's
// parameters), before_backward(l) when backward reaches block l's output, before any of block
// l's gradients are computed (also before a checkpointed block recomputes its forward).
// Hooks run on the thread that calls forward / backward; they may throw (the forward or
// backward then fails with that error).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_forward(int64_t layer) = 0;
  virtual void after_forward(int64_t layer) = 0;
  virtual void before_backward(int64_t layer) = 0;
};

// kPadId (core/special_tokens.h): keys equal to it are masked in attention, targets equal to it
// are ignored by the loss.

// Keys and values of every layer for incremental decoding (see LanguageModel::forward_cached).
// Start with a default-constructed (empty) cache; one cache serves one batch of sequences.
struct KVCache {
  std::vector<torch::Tensor> k, v;  // per layer: [batch, n_kv_heads, length, head_dim]
  torch::Tensor key_pad;            // [batch, length] bool: true where the cached token is kPadId
  int64_t length = 0;               // positions cached so far (the next token's position)

  // Empties the cache (the next forward_cached starts again at position 0).
  void clear() {
    k.clear();
    v.clear();
    key_pad = torch::Tensor();
    length = 0;
  }
};

// A decoder-only language model. Weights are float32; the forward pass also runs under bf16
// autocast: the matmuls in bf16, attention scores and softmax in bf16 with float32 accumulation
// inside the kernels (attention.h), logits returned in bf16 (lm_loss_sum and generate work on
// them in float32).
//
// Attention masks: a query at position i sees keys at positions <= i whose token is not kPadId.
// Masked scores are replaced by -1e9 (masked_fill, as the PyTorch reference), so a query whose
// every visible key is padding (an all-pad row, or the pads of a left-padded row) attends
// uniformly over all keys of the row — finite, never NaN, but meaningless: such positions must
// have pad targets. Every other position is exactly causal.
class LanguageModel : public torch::nn::Module {
 public:
  ~LanguageModel() override = default;

  // tokens [batch, seq] int64 with 1 <= seq <= max_seq_len() and ids in [0, vocab_size()) ->
  // logits [batch, seq, vocab] float32 (bf16 under bf16 autocast). Positions are 0..seq-1.
  // Throws mllm::Error on a wrong shape, dtype or length (ids are not range-checked here:
  // embedding lookups do that).
  virtual torch::Tensor forward(const torch::Tensor& tokens) = 0;

  // Incremental decoding: tokens [batch, new] int64 at positions cache.length ..
  // cache.length + new - 1 -> logits [batch, new, vocab] float32 (bf16 under bf16 autocast),
  // and appends their keys and values to `cache` (an empty cache is initialised). Equal to the
  // matching slice of forward() over the whole sequence (up to float rounding). Throws
  // mllm::Error when cache.length + new > max_seq_len() or the batch differs from the cached
  // one.
  virtual torch::Tensor forward_cached(const torch::Tensor& tokens, KVCache& cache) = 0;

  // tokens [batch, seq] int64 (as forward), targets [batch, seq] int64 -> [] float32: the summed
  // loss lm_loss_sum(forward(tokens), targets) (kernels/cross_entropy.h), what training and
  // evaluation compute. The built-in families run their output head and the loss as one through
  // head_loss (float32 on the CPU: no [batch * seq, vocab] logits, the same loss and gradients up
  // to float32 rounding); this default calls forward and lm_loss_sum. Throws what forward and
  // lm_loss_sum throw (on the fused path lm_head_loss_sum's errors instead of lm_loss_sum's).
  virtual torch::Tensor forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;

  // Number of trainable parameters (requires_grad), each tensor counted once (tied weights once).
  int64_t num_params() const;

  // Training FLOPs (forward + backward) per token for sequences of `seq_len` tokens:
  //   6 * N + 12 * n_layers * d_model * seq_len
  // N = parameters doing matmul work (all but the token and position tables; an output head
  // tied to the token table still counts as the V x d matmul it performs), 6 = 2 forward +
  // 4 backward FLOPs per weight per token (Kaplan et al. 2020, "Scaling Laws for Neural
  // Language Models", sec. 2.1); 12 L d T = attention scores and weighted values, forward and
  // backward, over the full T x T (PaLM, Chowdhery et al. 2022, appendix B). The same formula as
  // the PyTorch peer baseline (shared/peer/ddp_ref.py, count_params).
  virtual int64_t flops_per_token(int64_t seq_len) const = 0;

  // True for embedding tables (by parameter name as in named_parameters(): tok_emb.weight,
  // pos_emb.weight). The optimizer leaves them out of weight decay by default; biases and norm
  // weights are recognised by the optimizer itself (1-D tensors).
  virtual bool is_embedding(const std::string& param_name) const;

  // Activation checkpointing of the transformer blocks (model.activation_checkpointing): in
  // training mode with grad enabled, forward() runs the chosen blocks through checkpointed(), so
  // their inner activations are recomputed in backward instead of kept. Models whose forward runs
  // every block through run_block() support it and say so in supports_block_hooks(); set it on
  // another model and it throws mllm::ConfigError naming the model. forward_cached and eval
  // mode never checkpoint.
  void set_activation_checkpointing(const ActivationCheckpointing& ac);
  const ActivationCheckpointing& activation_checkpointing() const { return checkpointing_; }
  virtual bool supports_block_hooks() const { return false; }

  // Installs `hooks` around every block that forward() runs through run_block (also in eval
  // mode and under no_grad; forward_cached runs without them). nullptr removes them. Throws
  // mllm::ConfigError for a model whose supports_block_hooks() is false.
  void set_block_hooks(std::shared_ptr<BlockHooks> hooks);

  // The block (0-based) a parameter belongs to, by its name in named_parameters(), or -1 for
  // parameters outside the blocks (embeddings, final norm, head). The built-in families register
  // their blocks as "layers.<i>."; a model with another layout overrides this.
  virtual int64_t block_of(const std::string& param_name) const;

 protected:
  // The hook point around transformer block `layer` (0-based) of forward(): returns fn(x), or
  // checkpointed(fn, x) when that block is checkpointed, with the BlockHooks (if any) called
  // around it. fn must capture what it reads by value (backward may call it again after forward
  // returned).
  torch::Tensor run_block(int64_t layer, const torch::Tensor& x,
                          const std::function<torch::Tensor(const torch::Tensor&)>& fn);

 private:
  ActivationCheckpointing checkpointing_;
  std::shared_ptr<BlockHooks> hooks_;
};

// Factory signature: (model section, vocabulary size, resolved max_seq_len = recipe.max_seq_len()).
// Factories throw mllm::ConfigError for an inconsistent model section (naming the key).
using ModelRegistry =
    Registry<LanguageModel, const ModelConfig&, int64_t /*vocab_size*/, int64_t /*max_seq_len*/>;
ModelRegistry& model_registry();

// Registers "minillm" and "llama". Call once (a second call throws: names are taken).
void register_builtin_models();

// Building blocks the model families share, for the built-ins and for plugin models
// (examples/plugin/gelu_plugin.cpp uses them).

// The linear layers of a block, through the op of kernels/linear.h (its path chosen there: mllm's
// bf16 or float32 CPU kernels, or ATen's linear op as PyTorch's nn.Linear calls it, where a
// contiguous 3-D input with a bias is one addmm). Use linear(layer, x) instead of layer(x): the
// C++ frontend's Linear::forward decomposes into matmul(x, weight.t()) plus a separate bias add,
// so bf16 autocast sees a view of the weight, which it cannot cache, and casts every weight again
// on every call; through linear it casts weight and bias once per optimizer step
// (docs/precision.md). x [..., in] -> [..., out] = x @ layer->weight^T + layer->bias. Errors: as
// the op's.
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x);

// relu(linear(layer, x)), the same values [..., out] (kernels/linear.h: linear_relu, one fused op
// on mllm's CPU paths).
torch::Tensor linear_relu(const torch::nn::Linear& layer, const torch::Tensor& x);

// {linear(layers[i], x)} for several layers reading the same x [..., in] (attention's Q/K/V
// projections, SwiGLU's gate and up), each [..., out_i], the same values: one product where the
// op's linears takes them (kernels/linear.h), whose outputs are then views of one tensor and must
// not be modified in place.
std::vector<torch::Tensor> linears(const std::vector<torch::nn::Linear>& layers,
                                   const torch::Tensor& x);

// Weight init shared by the families (documented in minillm.h / llama.h): every Linear weight
// and embedding table ~ normal(0, std); weights whose name ends in one of `residual_suffixes`
// ~ normal(0, std / sqrt(2 n_layers)) (GPT-2 / Megatron residual scaling); biases 0; norm
// weights ("norm" in the name, 1-D) 1. Uses the global torch generator (torch::manual_seed).
void init_weights(torch::nn::Module& model, double std, int64_t n_layers,
                  const std::vector<std::string>& residual_suffixes);

// Blocked-attention mask for queries at positions offset .. offset+T-1 over S = offset + T keys:
// [batch, 1, T, S] bool, true where the key must be masked (in the future or padding).
// key_pad: [batch, S] bool, true where the key token is kPadId.
torch::Tensor blocked_mask(const torch::Tensor& key_pad, int64_t query_len, int64_t offset);
// The mask the attention layers get when no cache offsets the queries and no key is padding
// (packed training batches): undefined with `sdpa` (sdpa's is_causal), else the causal mask
// [1, 1, T, T] alone, built once per shape and shared. blocked_mask() otherwise (also for
// eager attention on an accelerator, to avoid reading back from the device). With sdpa on CUDA
// this reads one bool back from the device (whether any key is padding).
torch::Tensor attention_mask(const torch::Tensor& key_pad, int64_t query_len, int64_t offset,
                             bool sdpa);

// Checks tokens [batch, seq] int64 for forward / forward_cached; throws mllm::Error naming
// `what` and the offending shape, dtype or length.
void check_tokens(const torch::Tensor& tokens, int64_t offset, int64_t max_seq_len,
                  const char* what);

// Appends the new tokens' pad flags to cache.key_pad (initialising it) and returns the
// [batch, S] key pad mask for attention. Throws mllm::Error when the batch size changes.
torch::Tensor extend_key_pad(KVCache& cache, const torch::Tensor& tokens, int64_t n_layers);

}  // namespace mllm
