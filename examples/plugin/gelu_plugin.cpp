// An example mllm plugin: a model family and a callback, each with recipe options of its own.
//
//   model.type: gelu_mini   MiniLLM's decoder (learned positions, post-LayerNorm blocks, the
//                           shared mllm::Attention) with a GeLU feed-forward whose width is
//                           model.options.expansion x d_model.
//   callbacks: [loss_ema]   an exponential moving average of the training loss, written every
//                           loss_ema.every steps to <run.out_dir>/loss_ema.jsonl by rank 0, and
//                           beside each evaluation's val loss (the on_eval_end hook).
//
// Recipe: gelu.yaml. Walkthrough: docs/plugins.md in the mllm sources.
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/options.h"
#include "mllm/core/plugin.h"
#include "mllm/model/attention.h"
#include "mllm/model/model.h"
#include "mllm/train/callback.h"
#include "mllm/train/trainer.h"

// The build stamp: mllm-train refuses this library if it was built against another mllm.
MLLM_PLUGIN_STAMP();

namespace {

// --- model.type: gelu_mini ---------------------------------------------------------------------

struct GeluMiniOptions {
  int64_t vocab_size = 0, max_seq_len = 0;
  int64_t d_model = 0, n_heads = 0, n_layers = 0, d_ff = 0;
  double dropout = 0, attn_dropout = 0, norm_eps = 1e-5, init_std = 0.02;
  bool tanh_approximation = false;  // model.options.activation: gelu (erf) or gelu_tanh
  std::string attn_impl = "eager";
};

// x = norm1(x + drop(attn(x))); x = norm2(x + drop(fc2(gelu(fc1(x)))))
class GeluBlockImpl : public torch::nn::Module {
 public:
  explicit GeluBlockImpl(const GeluMiniOptions& o) : tanh_(o.tanh_approximation) {
    mllm::AttentionOptions a;
    a.d_model = o.d_model;
    a.n_heads = o.n_heads;
    a.n_kv_heads = o.n_heads;
    a.attn_dropout = o.attn_dropout;
    a.impl = o.attn_impl;
    attn = register_module("attn", mllm::Attention(a));
    fc1 = register_module("fc1", torch::nn::Linear(o.d_model, o.d_ff));
    fc2 = register_module("fc2", torch::nn::Linear(o.d_ff, o.d_model));
    const auto ln = torch::nn::LayerNormOptions({o.d_model}).eps(o.norm_eps);
    norm1 = register_module("norm1", torch::nn::LayerNorm(ln));
    norm2 = register_module("norm2", torch::nn::LayerNorm(ln));
    drop = register_module("drop", mllm::Dropout(o.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& blocked, int64_t offset,
                        torch::Tensor* cache_k, torch::Tensor* cache_v) {
    auto h = norm1(x + drop(attn(x, blocked, nullptr, offset, cache_k, cache_v)));
    // mllm::linear, not fc1(h): bf16 autocast then casts each weight once per step (model.h).
    auto f = mllm::linear(fc2, torch::gelu(mllm::linear(fc1, h), tanh_ ? "tanh" : "none"));
    return norm2(h + drop(f));
  }
  mllm::Attention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  mllm::Dropout drop{nullptr};

 private:
  bool tanh_;
};
TORCH_MODULE(GeluBlock);

class GeluMini : public mllm::LanguageModel {
 public:
  explicit GeluMini(const GeluMiniOptions& o) : o_(o) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(o.vocab_size, o.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(o.max_seq_len, o.d_model));
    drop = register_module("drop", mllm::Dropout(o.dropout));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layers; ++i) {
      blocks_.emplace_back(o);
      layers->push_back(blocks_.back());
    }
    lm_head = register_module("lm_head", torch::nn::Linear(o.d_model, o.vocab_size));
    // The built-in families' init: normal(0, init_std), residual projections scaled down.
    mllm::init_weights(*this, o.init_std, o.n_layers, {"attn.o_proj.weight", "fc2.weight"});
  }

  // bf16 under bf16 autocast: lm_loss_sum reads the logits in float32.
  torch::Tensor forward(const torch::Tensor& tokens) override {
    return mllm::linear(lm_head, hidden(tokens, nullptr));
  }
  torch::Tensor forward_cached(const torch::Tensor& tokens, mllm::KVCache& cache) override {
    return mllm::linear(lm_head, hidden(tokens, &cache));
  }
  // What training and evaluation call: the head and the loss as one (float32 on the CPU: no
  // [batch * seq, vocab] logits; mllm/kernels/cross_entropy.h).
  torch::Tensor forward_loss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    return mllm::head_loss(lm_head, hidden(tokens, nullptr), targets);
  }
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_seq_len; }
  // 6 N + 12 L d T, the convention of LanguageModel::flops_per_token (tables excluded from N).
  int64_t flops_per_token(int64_t seq_len) const override {
    const int64_t tables = tok_emb->weight.numel() + pos_emb->weight.numel();
    return 6 * (num_params() - tables) + 12 * o_.n_layers * o_.d_model * seq_len;
  }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  mllm::Dropout drop{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  // tokens -> the hidden states the head reads [batch, seq, d_model].
  torch::Tensor hidden(const torch::Tensor& tokens, mllm::KVCache* cache) {
    // The masking helpers the built-in families share (mllm/model/model.h).
    const int64_t offset = cache ? cache->length : 0;
    mllm::check_tokens(tokens, offset, o_.max_seq_len, "gelu_mini forward");
    const int64_t t = tokens.size(1);
    auto key_pad = cache ? mllm::extend_key_pad(*cache, tokens, o_.n_layers) : tokens.eq(mllm::kPadId);
    auto blocked = mllm::attention_mask(key_pad, t, offset, mllm::uses_sdpa(o_.attn_impl, tokens.device()));
    auto positions = torch::arange(offset, offset + t, tokens.options());
    auto x = drop(tok_emb(tokens) * std::sqrt(double(o_.d_model)) + pos_emb(positions));
    for (size_t l = 0; l < blocks_.size(); ++l)
      x = blocks_[l]->forward(x, blocked, offset, cache ? &cache->k[l] : nullptr,
                              cache ? &cache->v[l] : nullptr);
    if (cache) cache->length += t;
    return x;
  }

  GeluMiniOptions o_;
  std::vector<GeluBlock> blocks_;
};

std::shared_ptr<mllm::LanguageModel> make_gelu_mini(const mllm::ModelConfig& c, int64_t vocab,
                                                    int64_t max_seq_len) {
  if (c.d_ff != 0)
    throw mllm::ConfigError("model.d_ff: gelu_mini sizes its feed-forward with "
                            "model.options.expansion; leave model.d_ff at 0");
  GeluMiniOptions o;
  o.vocab_size = vocab;
  o.max_seq_len = max_seq_len;
  o.d_model = c.d_model;
  o.n_heads = c.n_heads;
  o.n_layers = c.n_layers;
  o.d_ff = c.options.integer("expansion") * c.d_model;
  o.tanh_approximation = c.options.string("activation") == "gelu_tanh";
  o.dropout = c.dropout;
  o.attn_dropout = c.attn_dropout.value_or(c.dropout);
  o.norm_eps = c.norm_eps;
  o.init_std = c.init_std;
  o.attn_impl = c.attn_impl;
  spdlog::info("gelu_mini: d_ff {} ({} x d_model), activation {}", o.d_ff,
               c.options.integer("expansion"), c.options.string("activation"));
  return std::make_shared<GeluMini>(o);
}

// --- callbacks: [loss_ema] ----------------------------------------------------------------------

// ema_0 = loss_1; ema_s = beta * ema_{s-1} + (1 - beta) * loss_s (skipped updates leave it).
class LossEma : public mllm::Callback {
 public:
  explicit LossEma(const mllm::Options& o) : every_(o.integer("every")), beta_(o.number("beta")) {}
  // With metrics and eval, before the checkpoint: listed before eval in `callbacks:`, its
  // on_step_end has taken in the step's loss when that step's evaluation reaches on_eval_end.
  mllm::CallbackPhase phase() const override { return mllm::CallbackPhase::kBeforeSave; }

  void on_step_end(mllm::Trainer& t, const mllm::StepMetrics& m) override {
    if (m.skipped) return;
    ema_ = seen_ ? beta_ * ema_ + (1 - beta_) * m.loss : m.loss;
    seen_ = true;
    if (m.step % every_ != 0 || t.comm().rank() != 0) return;
    std::ofstream out(t.run_dir() + "/loss_ema.jsonl", std::ios::app);
    out << fmt::format("{{\"step\": {}, \"loss\": {:.9g}, \"loss_ema\": {:.9g}}}\n", m.step, m.loss,
                       ema_);
    if (!out) throw mllm::Error("cannot write " + t.run_dir() + "/loss_ema.jsonl");
    spdlog::info("loss_ema: step {} loss {:.4f} ema {:.4f}", m.step, m.loss, ema_);
  }

  // Each evaluation: the val loss beside the smoothed train loss (their gap shows overfitting).
  void on_eval_end(mllm::Trainer& t, const mllm::EvalMetrics& e) override {
    if (t.comm().rank() != 0) return;
    std::ofstream out(t.run_dir() + "/loss_ema.jsonl", std::ios::app);
    out << fmt::format("{{\"step\": {}, \"val_loss\": {:.9g}, \"loss_ema\": {:.9g}}}\n", e.step,
                       e.val_loss, ema_);
    if (!out) throw mllm::Error("cannot write " + t.run_dir() + "/loss_ema.jsonl");
  }

 private:
  int64_t every_;
  double beta_;
  double ema_ = 0;
  bool seen_ = false;
};

}  // namespace

// Called once by mllm-train when it loads this library (recipe `plugins:`).
extern "C" void mllm_register_plugin() {
  mllm::model_registry().add("gelu_mini", make_gelu_mini);
  mllm::register_options(
      "model", "gelu_mini",
      mllm::OptionSchema()
          .integer("expansion", 4, "feed-forward width as a multiple of model.d_model",
                   mllm::OptionRange::between(1, 16))
          .string("activation", "gelu", "gelu (exact, erf) or gelu_tanh (tanh approximation)",
                  {"gelu", "gelu_tanh"}));

  mllm::callback_registry().add("loss_ema", [](const mllm::Recipe& r) {
    return std::make_shared<LossEma>(r.options_of_callback("loss_ema"));
  });
  mllm::register_options(
      "callback", "loss_ema",
      mllm::OptionSchema()
          .integer("every", 20, "write the average every N steps", mllm::OptionRange::at_least(1))
          .number("beta", 0.9, "smoothing factor of the moving average", {0.0, 1.0, false, true}));
}
