// A tiny self-contained language model and batch generator for the data-parallel tests:
// embedding -> linear -> tanh -> linear, summed cross-entropy over real (non-PAD = 0) targets.
// Batches come from a fixed integer recipe, so every rank can build the whole global batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mllm::test {

struct TinyLMImpl : torch::nn::Module {
  TinyLMImpl(int64_t vocab, int64_t d_model, int64_t d_hidden)
      : emb(register_module("emb", torch::nn::Embedding(vocab, d_model))),
        fc1(register_module("fc1", torch::nn::Linear(d_model, d_hidden))),
        fc2(register_module("fc2", torch::nn::Linear(d_hidden, vocab))),
        vocab_size(vocab) {}
  // tokens [batch, seq] int64 -> logits [batch, seq, vocab] float32
  torch::Tensor forward(const torch::Tensor& tokens) {
    return fc2(torch::tanh(fc1(emb(tokens))));
  }
  torch::nn::Embedding emb;
  torch::nn::Linear fc1, fc2;
  int64_t vocab_size;
};
TORCH_MODULE(TinyLM);

// Model with parameters drawn from torch's generator seeded with `seed`.
inline std::shared_ptr<TinyLMImpl> make_tiny_lm(uint64_t seed, int64_t vocab = 13,
                                                 int64_t d_model = 16, int64_t d_hidden = 32) {
  torch::manual_seed(seed);
  return TinyLM(vocab, d_model, d_hidden).ptr();
}

// Summed cross-entropy over targets != 0 (PAD), as a 0-dim float32 tensor.
inline torch::Tensor summed_loss(TinyLMImpl& m, const torch::Tensor& inputs,
                                 const torch::Tensor& targets) {
  auto logits = m.forward(inputs);
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, m.vocab_size}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).reduction(torch::kSum));
}

// Mean cross-entropy over the real targets (torch's own ignore_index mean): the reference.
inline torch::Tensor mean_loss(TinyLMImpl& m, const torch::Tensor& inputs,
                               const torch::Tensor& targets) {
  auto logits = m.forward(inputs);
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, m.vocab_size}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).reduction(torch::kMean));
}

// Sequences [n, seq_len] of inputs and targets; sequence i has real_targets[i] real targets
// (ids 1..vocab-1 from a fixed LCG), the rest PAD (0).
struct Batch {
  torch::Tensor inputs, targets;
  int64_t real_tokens = 0;
};

inline Batch make_batch(const std::vector<int64_t>& real_targets, int64_t seq_len, int64_t vocab,
                        uint64_t salt) {
  const int64_t n = static_cast<int64_t>(real_targets.size());
  auto inputs = torch::zeros({n, seq_len}, torch::kLong);
  auto targets = torch::zeros({n, seq_len}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto tg = targets.accessor<int64_t, 2>();
  uint64_t x = 0x9E3779B97F4A7C15ULL ^ salt;
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < seq_len; ++j) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // Knuth's MMIX LCG
      const int64_t tok = 1 + static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab - 1));
      in[i][j] = tok;
      tg[i][j] = j < real_targets[i] ? 1 + (tok * 7 + j) % (vocab - 1) : 0;
    }
    b.real_tokens += std::min(real_targets[i], seq_len);
  }
  b.inputs = inputs;
  b.targets = targets;
  return b;
}

// Rows [start, start + count) of a batch.
inline Batch slice(const Batch& b, int64_t start, int64_t count) {
  Batch s;
  s.inputs = b.inputs.narrow(0, start, count);
  s.targets = b.targets.narrow(0, start, count);
  s.real_tokens = s.targets.ne(0).sum().item<int64_t>();
  return s;
}

// FNV-1a 64 over a tensor's bytes, to compare tensors bitwise across ranks.
inline std::string bytes_hash(const torch::Tensor& t) {
  auto c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return std::to_string(h);
}

}  // namespace mllm::test
