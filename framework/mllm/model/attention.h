// Multi-head causal self-attention shared by every model family (minillm: n_kv_heads == n_heads
// with biases; llama: grouped key/value heads, rotary positions, no biases), and rotary
// position embeddings (RoPE).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "mllm/kernels/attention.h"
#include "mllm/model/dropout.h"

namespace mllm {

// Rotary position embedding tables (Su et al. 2021, "RoFormer"), in Meta's LLaMA convention
// (facebookresearch/llama model.py apply_rotary_emb, also llama2.c and the Happy-LLM tutorial):
// the head vector is read as head_dim/2 consecutive pairs (x[2i], x[2i+1]); pair i at position p
// is rotated by the angle p * theta^(-2i / head_dim):
//   out[2i]   = x[2i] cos - x[2i+1] sin,    out[2i+1] = x[2i] sin + x[2i+1] cos.
// (HF transformers instead rotates halves (x[i], x[i + head_dim/2]); weights differ by a
// permutation of the q/k projection rows.) Tables are float32, computed as Meta does in float32.
// A module whose tables are buffers ("cos", "sin"), so that Module::to() moves them with the
// model once (no host-to-device copy per forward). Not serialised (is_serializable() false, like
// PyTorch's register_buffer(persistent=False)): the tables follow from the options, and
// checkpoints hold weights only, as before.
class Rotary : public torch::nn::Module {
 public:
  // head_dim even; positions 0 .. max_seq_len-1. Throws mllm::Error for an odd head_dim.
  Rotary(int64_t head_dim, int64_t max_seq_len, double theta);

  // x [batch, seq, heads, head_dim] at positions offset .. offset+seq-1 -> rotated, same shape
  // and dtype as x (computed in float32). Throws mllm::Error past max_seq_len. The tables are
  // used where they are: on x's device when the module was moved there, else copied for the call.
  torch::Tensor apply(const torch::Tensor& x, int64_t offset) const;

  bool is_serializable() const override { return false; }

 private:
  torch::Tensor cos_, sin_;  // [max_seq_len, head_dim/2] float32, buffers "cos" and "sin"
};

struct AttentionOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;     // divides n_heads; == n_heads for plain multi-head attention
  bool bias = true;           // biases on the four projections
  double attn_dropout = 0.0;  // dropout on the attention probabilities (training only)
  std::string impl = "eager";  // eager | sdpa | auto (model.attn_impl; see uses_sdpa)
};

// Separate Q/K/V/O projections (parameters q_proj, k_proj, v_proj, o_proj). Heads are split to
// [batch, heads, seq, head_dim]; key/value head j serves query heads j*r .. j*r+r-1 with
// r = n_heads / n_kv_heads (repeat_interleave, as Meta's repeat_kv).
// The path is the op's choice (kernels/attention.h: attention_path): mllm's fused CPU kernel
// (no KV cache, bf16 or float32 q/k/v where mllm's products run), LibTorch's sdpa (impl sdpa,
// or auto on CUDA), or eager, written out in attention.cpp: scores / sqrt(head_dim),
// masked_fill(blocked, -1e9), softmax, dropout, weighted sum of values, o_proj — float32 scores
// when autocast is off, as the PyTorch reference computes them; under bf16 autocast the scores,
// softmax and dropout stay bf16 (q * 1/sqrt(head_dim) before the product; the mask added as a
// bias of 0 / -1e9, which gives masked_fill's values; the softmax kernels accumulate in float32
// and round once).
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);

  // x [batch, seq, d_model] -> [batch, seq, d_model] (dtype follows autocast / the weights).
  // blocked [batch or 1, 1, seq, keys] bool, true = masked; keys = cached length + seq. Undefined
  // (sdpa only): causal, no padding, no cache.
  // rope: rotary tables applied to q and k at positions offset.. (nullptr: none).
  // cache_k / cache_v: when non-null, this call's keys and values are appended to them
  // ([batch, n_kv_heads, len, head_dim]; undefined = empty) and attention runs over all of them.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& blocked, const Rotary* rope,
                        int64_t offset, torch::Tensor* cache_k = nullptr,
                        torch::Tensor* cache_v = nullptr);

  int64_t n_heads() const { return options_.n_heads; }
  int64_t n_kv_heads() const { return options_.n_kv_heads; }
  int64_t head_dim() const { return head_dim_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  AttentionOptions options_;
  int64_t head_dim_;
  Dropout attn_drop_{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace mllm
