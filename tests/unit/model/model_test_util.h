// Helpers for the model tests: tiny models of both families built through the registry.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "mllm/core/recipe.h"
#include "mllm/model/model.h"

namespace mllm::test {

inline void ensure_models_registered() {
  if (!model_registry().contains("minillm")) register_builtin_models();
}

// A tiny config of `type`: d_model 16, 2 heads (llama: 4 heads, 2 kv heads), 2 layers.
inline ModelConfig tiny_config(const std::string& type, double dropout = 0.0) {
  ModelConfig c;
  c.type = type;
  c.d_model = 16;
  c.n_heads = type == "llama" ? 4 : 2;
  c.n_kv_heads = type == "llama" ? 2 : 0;
  c.n_layers = 2;
  c.d_ff = 0;
  c.multiple_of = 16;
  c.dropout = dropout;
  c.init_std = 0.2;  // larger than the training default so logits differ visibly
  return c;
}

inline std::shared_ptr<LanguageModel> make_model(const ModelConfig& c, int64_t vocab = 37,
                                                 int64_t max_seq_len = 8, uint64_t seed = 7) {
  ensure_models_registered();
  torch::manual_seed(seed);
  auto m = model_registry().create(c.type, c, vocab, max_seq_len);
  m->eval();
  return m;
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Uniform ids in [1, vocab) (never the pad id), [batch, seq] int64.
inline torch::Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(1, vocab, {batch, seq}, gen, torch::kLong);
}

}  // namespace mllm::test
