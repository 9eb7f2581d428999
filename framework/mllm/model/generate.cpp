// Sampling filters and the KV-cached generation loop.
#include "mllm/model/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <string>

#include "mllm/core/error.h"

namespace mllm {

namespace {

void check_filters(int64_t top_k, double top_p) {
  if (top_k < 0)
    throw ConfigError("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0))
    throw ConfigError("top_p must be in (0, 1] (1 = off), got " + std::to_string(top_p));
}

// Restores the module's train/eval mode when generation ends (also on exceptions).
class EvalModeGuard {
 public:
  explicit EvalModeGuard(torch::nn::Module& m) : m_(m), was_training_(m.is_training()) {
    m_.eval();
  }
  ~EvalModeGuard() { m_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  torch::nn::Module& m_;
  bool was_training_;
};

}  // namespace

torch::Tensor filter_logits(const torch::Tensor& logits, int64_t top_k, double top_p) {
  check_filters(top_k, top_p);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto out = logits.to(torch::kFloat).clone();
  const int64_t vocab = out.size(-1);
  if (top_k > 0 && top_k < vocab) {
    auto kth = std::get<0>(out.topk(top_k, -1)).narrow(-1, top_k - 1, 1);  // [..., 1]
    out.masked_fill_(out < kth, neg_inf);
  }
  if (top_p < 1.0) {
    auto sorted = out.sort(-1, /*descending=*/true);
    auto probs = torch::softmax(std::get<0>(sorted), -1);
    auto mass_before = probs.cumsum(-1) - probs;  // mass of the strictly more likely tokens
    auto remove_sorted = mass_before >= top_p;
    auto remove = torch::zeros_like(remove_sorted).scatter(-1, std::get<1>(sorted), remove_sorted);
    out.masked_fill_(remove, neg_inf);
  }
  return out;
}

void check_generate_options(const GenerateOptions& opt) {
  if (opt.temperature < 0)
    throw ConfigError("temperature must be >= 0 (0 = greedy), got " +
                      std::to_string(opt.temperature));
  if (opt.max_new_tokens < 0)
    throw ConfigError("max_new_tokens must be >= 0, got " + std::to_string(opt.max_new_tokens));
  check_filters(opt.top_k, opt.top_p);
}

std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& opt,
                              const std::function<void(int64_t)>& on_token) {
  check_generate_options(opt);
  if (prompt.empty())
    throw DataError("generate: the prompt is empty; it needs at least one token (e.g. BOS)");
  const int64_t vocab = model.vocab_size(), window = model.max_seq_len();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw DataError("generate: prompt token " + std::to_string(i) + " has id " +
                      std::to_string(prompt[i]) + ", outside the model's vocabulary [0, " +
                      std::to_string(vocab) + "); was the prompt encoded with the tokenizer "
                      "the model was trained with?");
  }
  std::vector<int64_t> out;
  if (opt.max_new_tokens == 0) return out;

  torch::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const auto params = model.parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);

  // Context = cropped prompt + generated ids; the cache holds a suffix of it.
  const size_t start = prompt.size() > static_cast<size_t>(window) ? prompt.size() - window : 0;
  std::vector<int64_t> context(prompt.begin() + static_cast<std::ptrdiff_t>(start), prompt.end());
  KVCache cache;
  auto feed = [&](size_t from) {  // runs context[from..] through the cache -> last logits [V]
    const int64_t n = static_cast<int64_t>(context.size() - from);
    // Copy: the blob is `context`'s storage, which the next push_back may move.
    auto ids = torch::from_blob(context.data() + from, {1, n}, torch::kLong)
                   .to(device, /*non_blocking=*/false, /*copy=*/true);
    auto logits = model.forward_cached(ids, cache);
    return logits.select(1, n - 1).squeeze(0).to(torch::kCPU, torch::kFloat);
  };
  auto sample = [&](const torch::Tensor& logits) -> int64_t {
    if (opt.temperature == 0) return logits.argmax().item<int64_t>();
    auto probs = torch::softmax(filter_logits(logits / opt.temperature, opt.top_k, opt.top_p), -1);
    return torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
  };

  auto logits = feed(0);
  while (true) {
    const int64_t id = sample(logits);
    if (opt.eos_id >= 0 && id == opt.eos_id) break;
    out.push_back(id);
    context.push_back(id);
    if (on_token) on_token(id);
    if (static_cast<int64_t>(out.size()) >= opt.max_new_tokens) break;
    if (cache.length >= window) {
      // Full: restart the cache from the last window - 1 tokens (positions 0..window-2), which
      // leaves room for the next token; see generate.h.
      cache.clear();
      logits = feed(context.size() - static_cast<size_t>(window - 1));
    } else {
      logits = feed(context.size() - 1);
    }
  }
  return out;
}

}  // namespace mllm
