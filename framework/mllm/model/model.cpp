// LanguageModel's shared parts: parameter counting, masks, cache bookkeeping, weight init and
// the model registry.
#include "mllm/model/model.h"

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_set>

#include "mllm/core/error.h"
#include "mllm/model/llama.h"
#include "mllm/model/loss.h"
#include "mllm/model/minillm.h"

namespace mllm {

torch::Tensor LanguageModel::forward_loss(const torch::Tensor& tokens,
                                          const torch::Tensor& targets) {
  return lm_loss_sum(forward(tokens), targets);
}

int64_t LanguageModel::num_params() const {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters()) {
    if (!p.requires_grad()) continue;
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

bool LanguageModel::is_embedding(const std::string& param_name) const {
  return param_name == "tok_emb.weight" || param_name == "pos_emb.weight";
}

void LanguageModel::set_activation_checkpointing(const ActivationCheckpointing& ac) {
  if (ac.mode != "none" && !supports_block_hooks())
    throw ConfigError("model.activation_checkpointing: this model type runs its blocks without "
                      "LanguageModel::run_block, so none can be checkpointed; use none");
  checkpointing_ = ac;
}

namespace {

// y = x in forward; in backward calls hooks->before_backward(layer) and passes the gradient on.
// Applied to a block's output, so its backward runs before any node of the block's own.
class BackwardPreHook : public torch::autograd::Function<BackwardPreHook> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t hooks_address, int64_t layer) {
    ctx->saved_data["hooks"] = hooks_address;
    ctx->saved_data["layer"] = layer;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* hooks = reinterpret_cast<BlockHooks*>(ctx->saved_data["hooks"].toInt());
    hooks->before_backward(ctx->saved_data["layer"].toInt());
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void LanguageModel::set_block_hooks(std::shared_ptr<BlockHooks> hooks) {
  if (hooks && !supports_block_hooks())
    throw ConfigError("this model type runs its blocks without LanguageModel::run_block, so no "
                      "per-block hook can run (dist.zero_stage=3 needs them)");
  hooks_ = std::move(hooks);
}

int64_t LanguageModel::block_of(const std::string& param_name) const {
  static const std::string kPrefix = "layers.";
  if (param_name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  const size_t dot = param_name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return -1;
  int64_t layer = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (param_name[i] < '0' || param_name[i] > '9') return -1;
    layer = layer * 10 + (param_name[i] - '0');
  }
  return layer;
}

torch::Tensor LanguageModel::run_block(int64_t layer, const torch::Tensor& x,
                                       const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  const bool checkpoint = is_training() && checkpointing_.applies_to(layer);
  if (!hooks_) return checkpoint ? checkpointed(fn, x) : fn(x);
  hooks_->before_forward(layer);
  torch::Tensor y = checkpoint ? checkpointed(fn, x) : fn(x);
  hooks_->after_forward(layer);
  // The hooks object outlives the graph: the model holds it, and backward runs while the model
  // lives.
  if (torch::GradMode::is_enabled() && y.requires_grad())
    y = BackwardPreHook::apply(y, reinterpret_cast<int64_t>(hooks_.get()), layer);
  return y;
}

ModelRegistry& model_registry() {
  static ModelRegistry registry("model");
  return registry;
}

void register_builtin_models() {
  auto& r = model_registry();
  r.add("minillm", [](const ModelConfig& c, int64_t vocab, int64_t max_seq_len) {
    return std::make_shared<MiniLLM>(MiniLLMOptions::from_config(c, vocab, max_seq_len));
  });
  r.add("llama", [](const ModelConfig& c, int64_t vocab, int64_t max_seq_len) {
    return std::make_shared<Llama>(LlamaOptions::from_config(c, vocab, max_seq_len));
  });
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return linear(x, layer->weight, layer->bias);
}

torch::Tensor linear_relu(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return linear_relu(x, layer->weight, layer->bias);
}

std::vector<torch::Tensor> linears(const std::vector<torch::nn::Linear>& layers,
                                   const torch::Tensor& x) {
  std::vector<torch::Tensor> weights, biases;
  for (const auto& layer : layers) {
    weights.push_back(layer->weight);
    biases.push_back(layer->bias);
  }
  return linears(x, weights, biases);
}

void init_weights(torch::nn::Module& model, double std, int64_t n_layers,
                  const std::vector<std::string>& residual_suffixes) {
  torch::NoGradGuard no_grad;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(n_layers));
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (ends_with(name, ".bias")) {
      p.zero_();
    } else if (p.dim() == 1 && name.find("norm") != std::string::npos) {
      p.fill_(1.0);
    } else {
      bool residual = false;
      for (const auto& s : residual_suffixes) residual = residual || ends_with(name, s);
      p.normal_(0.0, residual ? residual_std : std);
    }
  }
}

namespace {
// [1, 1, query_len, s] bool, true where key j is in the future of query i (j > offset + i).
// Training and evaluation ask for the same few shapes every step: those (offset 0) are built
// once and shared (read-only); decoding offsets are built on each call.
namespace {
torch::Tensor future_mask(int64_t query_len, int64_t s, int64_t offset,
                          const torch::TensorOptions& options) {
  auto build = [&] {
    return torch::ones({query_len, s}, options).triu(offset + 1).view({1, 1, query_len, s});
  };
  if (offset != 0) return build();
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, std::string>, torch::Tensor> cache;
  const auto key = std::make_tuple(query_len, s, options.device().str());
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 32) cache.clear();  // bounded: a few shapes per run in practice
  return cache.emplace(key, build()).first->second;
}
}  // namespace
}  // namespace

torch::Tensor attention_mask(const torch::Tensor& key_pad, int64_t query_len, int64_t offset,
                             bool sdpa) {
  // Whether any key is padding: a cheap host-side test on the CPU; on an accelerator only where
  // it pays (sdpa's is_causal path), since it reads a value back from the device.
  const bool full_causal = offset == 0 && key_pad.size(1) == query_len;
  if ((sdpa || key_pad.device().is_cpu()) && full_causal && !key_pad.any().item<bool>())
    return sdpa ? torch::Tensor() : future_mask(query_len, query_len, 0, key_pad.options());
  return blocked_mask(key_pad, query_len, offset);
}

torch::Tensor blocked_mask(const torch::Tensor& key_pad, int64_t query_len, int64_t offset) {
  const int64_t b = key_pad.size(0), s = key_pad.size(1);
  // Query i (absolute position offset + i) may see key j when j <= offset + i.
  return future_mask(query_len, s, offset, key_pad.options()) | key_pad.view({b, 1, 1, s});
}

void check_tokens(const torch::Tensor& tokens, int64_t offset, int64_t max_seq_len,
                  const char* what) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.scalar_type() != torch::kLong)
    throw Error(std::string(what) + ": tokens must be a [batch, seq] int64 tensor, got " +
                (tokens.defined() ? std::to_string(tokens.dim()) + "-d " +
                                        std::string(c10::toString(tokens.scalar_type()))
                                  : std::string("an undefined tensor")));
  if (tokens.size(0) < 1 || tokens.size(1) < 1)
    throw Error(std::string(what) + ": empty token batch [" + std::to_string(tokens.size(0)) +
                ", " + std::to_string(tokens.size(1)) + "]");
  if (offset + tokens.size(1) > max_seq_len)
    throw Error(std::string(what) + ": " + std::to_string(offset) + " cached + " +
                std::to_string(tokens.size(1)) + " new tokens exceed max_seq_len=" +
                std::to_string(max_seq_len) +
                "; crop the input or raise model.max_seq_len (positions are learned/rotated "
                "only up to it)");
}

torch::Tensor extend_key_pad(KVCache& cache, const torch::Tensor& tokens, int64_t n_layers) {
  auto pad = tokens.eq(kPadId);
  if (cache.length == 0) {
    cache.k.assign(static_cast<size_t>(n_layers), torch::Tensor());
    cache.v.assign(static_cast<size_t>(n_layers), torch::Tensor());
    cache.key_pad = pad;
  } else {
    if (cache.key_pad.size(0) != tokens.size(0) ||
        static_cast<int64_t>(cache.k.size()) != n_layers)
      throw Error("forward_cached: the cache holds " + std::to_string(cache.key_pad.size(0)) +
                  " sequences of " + std::to_string(cache.k.size()) + " layers, got a batch of " +
                  std::to_string(tokens.size(0)) + " for a model of " + std::to_string(n_layers) +
                  " layers; clear() the cache for a new batch");
    cache.key_pad = torch::cat({cache.key_pad, pad}, 1);
  }
  return cache.key_pad;
}

}  // namespace mllm
