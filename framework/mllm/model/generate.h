// Autoregressive generation with a KV cache: greedy, temperature, top-k and top-p (nucleus)
// sampling from a seeded generator, EOS and max_new_tokens stops, token-by-token streaming.
// Text output is the caller's: feed on_token ids to the data area's IncrementalDecoder
// (mllm/data), which only emits complete UTF-8 characters, so a stream never splits one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "mllm/model/model.h"

namespace mllm {

struct GenerateOptions {
  int64_t max_new_tokens = 48;  // stop after this many new tokens (0: return at once)
  double temperature = 0.8;     // logits / temperature before sampling; 0 = greedy (argmax)
  int64_t top_k = 0;            // keep the k most likely tokens; 0 = off
  double top_p = 1.0;           // keep the smallest most-likely set with mass >= top_p; 1 = off
  uint64_t seed = 0;            // seeds generate's own CPU generator (the global RNG is untouched)
  int64_t eos_id = 3;           // stop when sampled (not returned); < 0 = never stop on a token
};

// Filters logits [..., vocab] (float) for sampling: returns a copy in which removed tokens are
// -inf. top_k > 0 keeps the tokens whose logit is >= the k-th largest (ties with the k-th are
// kept, as HF transformers' TopKLogitsWarper and nanoGPT); top_k = 0 or >= vocab keeps all.
// top_p < 1 then keeps, among those, the smallest set of most likely tokens whose probability
// (softmax of the kept logits) sums to >= top_p — a token is kept when the mass of the tokens
// strictly more likely than it (in sorted order) is < top_p, so the most likely token always
// survives (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"). top_p >= 1
// keeps all. Throws mllm::ConfigError for top_k < 0 or top_p <= 0.
torch::Tensor filter_logits(const torch::Tensor& logits, int64_t top_k, double top_p);

// Generates a continuation of `prompt` (token ids; at least one, each in [0, vocab)).
// The prompt is cropped to its last model.max_seq_len() tokens. Each step samples one id from
// the last position's logits: argmax when temperature == 0 (seed irrelevant), otherwise
// softmax(filter_logits(logits / temperature, top_k, top_p)) sampled with a CPU generator seeded
// by `seed` (same seed, model and prompt -> same ids). Stops at eos_id (not returned, not passed
// to on_token) or after max_new_tokens ids. on_token(id) is called for every returned id as soon
// as it is sampled (streaming).
//
// Cost: the prompt is encoded once; each new token then runs one position against the KV
// cache. When the cache is full (max_seq_len positions), the last max_seq_len - 1 tokens are
// re-encoded from position 0 into a fresh cache and decoding continues: the context is a window
// of the most recent max_seq_len - 1 .. max_seq_len tokens, at the cost of one full forward every
// other token past that point. Runs under NoGradGuard with the model in eval mode (dropout off);
// the previous train/eval mode is restored on return. Sampling happens on the CPU.
// Throws mllm::DataError for an empty prompt or an id outside [0, vocab), mllm::ConfigError for
// temperature < 0, max_new_tokens < 0, top_k < 0 or top_p <= 0.
std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& opt,
                              const std::function<void(int64_t)>& on_token = {});

// The option checks generate() makes, for callers that must refuse bad options before any
// output (mllm-generate): throws mllm::ConfigError for temperature < 0, max_new_tokens < 0,
// top_k < 0 or top_p <= 0, naming the option and the accepted range.
void check_generate_options(const GenerateOptions& opt);

}  // namespace mllm
