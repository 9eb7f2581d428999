// Model behaviour for both families: causality, padding, all-pad rows, KV cache, bf16 autocast,
// parameter counts and FLOPs against hand-computed formulas, init, registry and config errors.
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mllm/core/error.h"
#include "mllm/model/attention.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/kernels/cpu/attention.h"
#include "mllm/kernels/cpu/f32_linear.h"
#include "mllm/model/llama.h"
#include "mllm/model/loss.h"
#include "mllm/model/minillm.h"
#include "mllm/kernels/cpu/mkl_gemm.h"
#include "mllm/model/model.h"
#include "model_test_util.h"

namespace mllm {
namespace {

using test::make_model;
using test::max_abs_diff;
using test::random_tokens;
using test::tiny_config;

constexpr int64_t kVocab = 37;

class FamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyTest, FutureTokensDoNotChangeEarlierLogits) {
  auto model = make_model(tiny_config(GetParam(), /*dropout=*/0.1));  // eval(): dropout off
  auto tokens = random_tokens(2, 8, kVocab, 1);
  auto logits = model->forward(tokens);
  for (int64_t t : {0, 3, 6}) {
    auto changed = tokens.clone();
    const int64_t rest = 8 - t - 1;
    changed.narrow(1, t + 1, rest).copy_(random_tokens(2, rest, kVocab, 100 + t));
    ASSERT_FALSE(changed.equal(tokens));
    auto other = model->forward(changed);
    EXPECT_LE(max_abs_diff(other.narrow(1, 0, t + 1), logits.narrow(1, 0, t + 1)), 1e-6)
        << "position " << t;
    EXPECT_GT(max_abs_diff(other.narrow(1, t + 1, rest), logits.narrow(1, t + 1, rest)), 1e-3);
  }
}

TEST_P(FamilyTest, RightPaddedRowMatchesTheSequenceAlone) {
  auto model = make_model(tiny_config(GetParam()));
  auto alone = random_tokens(1, 5, kVocab, 2);
  auto batch = torch::zeros({2, 8}, torch::kLong);  // kPadId == 0
  batch[0].narrow(0, 0, 5).copy_(alone[0]);
  batch[1].copy_(random_tokens(1, 8, kVocab, 3)[0]);
  auto logits_alone = model->forward(alone);
  auto logits_batch = model->forward(batch);
  EXPECT_LE(max_abs_diff(logits_batch[0].narrow(0, 0, 5), logits_alone[0]), 1e-5);
  auto other_alone = model->forward(batch.narrow(0, 1, 1));
  EXPECT_LE(max_abs_diff(logits_batch[1], other_alone[0]), 1e-5);

  // Pad targets add nothing: the padded row's loss equals the sequence's loss alone.
  auto targets_alone = random_tokens(1, 5, kVocab, 4);
  auto targets = torch::zeros({2, 8}, torch::kLong);
  targets[0].narrow(0, 0, 5).copy_(targets_alone[0]);
  EXPECT_EQ(count_targets(targets), 5);
  auto loss_batch = lm_loss_sum(logits_batch, targets);
  auto loss_alone = lm_loss_sum(logits_alone, targets_alone);
  EXPECT_NEAR(loss_batch.item<double>(), loss_alone.item<double>(), 1e-5);
}

TEST_P(FamilyTest, AllPadRowsGiveNoNaN) {
  auto model = make_model(tiny_config(GetParam(), /*dropout=*/0.1));
  model->train();
  auto tokens = random_tokens(3, 8, kVocab, 5);
  tokens[1].zero_();                      // all pad
  tokens[2].narrow(0, 0, 3).zero_();      // left pads: their queries see only pad keys
  auto targets = random_tokens(3, 8, kVocab, 6);
  targets[1].zero_();
  targets[2].narrow(0, 0, 3).zero_();
  auto logits = model->forward(tokens);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  auto loss = lm_loss_sum(logits, targets);
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  // An all-pad batch has no targets: loss exactly 0.
  auto all_pad = torch::zeros({2, 8}, torch::kLong);
  auto zero = lm_loss_sum(model->forward(all_pad), all_pad);
  EXPECT_EQ(zero.item<double>(), 0.0);
  EXPECT_EQ(count_targets(all_pad), 0);
}

TEST_P(FamilyTest, KVCacheDecodingEqualsFullForward) {
  auto model = make_model(tiny_config(GetParam()));
  auto tokens = random_tokens(2, 8, kVocab, 7);
  tokens[1].narrow(0, 5, 3).zero_();  // right-padded row: cached pad keys stay masked
  auto full = model->forward(tokens);
  KVCache cache;
  std::vector<torch::Tensor> parts;
  int64_t pos = 0;
  for (int64_t n : {3, 1, 1, 2, 1}) {
    parts.push_back(model->forward_cached(tokens.narrow(1, pos, n), cache));
    pos += n;
    EXPECT_EQ(cache.length, pos);
  }
  EXPECT_LE(max_abs_diff(torch::cat(parts, 1), full), 1e-4);
  ASSERT_EQ(static_cast<int64_t>(cache.k.size()), 2);
  // Tiny configs: 2 key/value heads in both; head size 8 (minillm, 2 heads) or 4 (llama, 4).
  const int64_t head_dim = GetParam() == "llama" ? 4 : 8;
  EXPECT_EQ(cache.k[0].sizes(), (std::vector<int64_t>{2, 2, 8, head_dim}));

  // Full cache: one more position is an error, and so is another batch size.
  EXPECT_THROW(model->forward_cached(tokens.narrow(1, 0, 1), cache), Error);
  KVCache other;
  model->forward_cached(tokens.narrow(1, 0, 2), other);
  EXPECT_THROW(model->forward_cached(tokens.narrow(0, 0, 1).narrow(1, 2, 1), other), Error);
  cache.clear();
  // The whole sequence at once: within 2^-20 of the logits' largest magnitude (a few units in
  // the last place of it: forward's fused attention and the cached path's unfused one round
  // differently; 4.8e-7 and 1.3e-6 of 2.7 and 2.4 were seen for the two families).
  EXPECT_LE(max_abs_diff(model->forward_cached(tokens, cache), full),
            std::ldexp(1.0, -20) * full.abs().max().item<double>());
}

TEST_P(FamilyTest, RejectsBadTokenTensors) {
  auto model = make_model(tiny_config(GetParam()));
  EXPECT_THROW(model->forward(random_tokens(1, 9, kVocab, 1)), Error);  // > max_seq_len 8
  EXPECT_THROW(model->forward(torch::ones({8}, torch::kLong)), Error);
  EXPECT_THROW(model->forward(torch::ones({1, 4}, torch::kInt)), Error);
}

// RAII for CPU bf16 autocast.
struct CpuBf16Autocast {
  CpuBf16Autocast() {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~CpuBf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
};

TEST_P(FamilyTest, Bf16AutocastForwardIsCloseToFp32) {
  auto model = make_model(tiny_config(GetParam()));
  auto tokens = random_tokens(2, 8, kVocab, 8);
  tokens[1].narrow(0, 6, 2).zero_();
  auto fp32 = model->forward(tokens);
  torch::Tensor bf16;
  {
    CpuBf16Autocast autocast;
    bf16 = model->forward(tokens);
    KVCache cache;  // the cached path runs under autocast too
    model->forward_cached(tokens.narrow(1, 0, 5), cache);
    auto step = model->forward_cached(tokens.narrow(1, 5, 1), cache);
    EXPECT_TRUE(torch::isfinite(step).all().item<bool>());
  }
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);  // the head's output, for lm_loss_sum
  const double scale = fp32.abs().max().item<double>();
  ASSERT_GT(scale, 0.5);
  // bf16 keeps 8 significant bits (relative rounding 2^-9 per op); a few percent of the logit
  // range after two layers.
  EXPECT_LE(max_abs_diff(bf16, fp32), 0.05 * scale);
  EXPECT_GT(max_abs_diff(bf16, fp32), 0.0);  // it really ran in bf16
}

TEST_P(FamilyTest, InitIsSeededAndDocumented) {
  auto c = tiny_config(GetParam());
  c.d_model = 64;
  c.init_std = 0.02;
  auto a = make_model(c, kVocab, 8, /*seed=*/11);
  auto b = make_model(c, kVocab, 8, /*seed=*/11);
  auto a_params = a->named_parameters();
  auto b_params = b->named_parameters();
  for (const auto& p : a_params) {
    const auto& v = p.value();
    EXPECT_TRUE(v.equal(b_params[p.key()])) << p.key();
    const std::string& n = p.key();
    if (n.size() > 5 && n.substr(n.size() - 5) == ".bias") {
      EXPECT_EQ(v.abs().max().item<double>(), 0.0) << n;
    } else if (v.dim() == 1) {
      EXPECT_TRUE(v.eq(1.0).all().item<bool>()) << n;  // LayerNorm / RMSNorm weights
    }
  }
  const double residual = 0.02 / std::sqrt(2.0 * 2);
  const std::string down = GetParam() == "llama" ? "layers.0.ffn.down_proj.weight" : "layers.0.ffn.fc2.weight";
  EXPECT_NEAR(a_params["layers.0.attn.o_proj.weight"].std().item<double>(), residual, 0.1 * residual);
  EXPECT_NEAR(a_params[down].std().item<double>(), residual, 0.1 * residual);
  EXPECT_NEAR(a_params["layers.0.attn.q_proj.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(a_params["tok_emb.weight"].std().item<double>(), 0.02, 0.002);
  auto c2 = make_model(c, kVocab, 8, /*seed=*/12);
  EXPECT_FALSE(c2->named_parameters()["tok_emb.weight"].equal(a_params["tok_emb.weight"]));
}

// model.attn_impl: LibTorch's scaled_dot_product_attention agrees with the explicit reference
// path on logits, loss and every gradient — without padding (the is_causal path, no mask
// tensor), with right- and left-padded and all-pad rows (the additive -1e9 mask), through a KV
// cache, and under bf16 autocast. Same weights: both models come from the same seed.
TEST_P(FamilyTest, SdpaAttentionMatchesEager) {
  auto eager_cfg = tiny_config(GetParam());
  eager_cfg.attn_impl = "eager";
  auto sdpa_cfg = eager_cfg;
  sdpa_cfg.attn_impl = "sdpa";
  auto eager = make_model(eager_cfg);
  auto sdpa = make_model(sdpa_cfg);
  auto padded = random_tokens(4, 8, kVocab, 21);
  padded[0].narrow(0, 5, 3).fill_(0);  // right-padded
  padded[1].narrow(0, 0, 2).fill_(0);  // left-padded
  padded[3].fill_(0);                  // all padding
  for (const auto& tokens : {random_tokens(2, 8, kVocab, 20), padded}) {
    auto targets = random_tokens(tokens.size(0), 8, kVocab, 22).masked_fill(tokens.eq(0), 0);
    auto loss_e = lm_loss_sum(eager->forward(tokens), targets);
    auto loss_s = lm_loss_sum(sdpa->forward(tokens), targets);
    EXPECT_LE(max_abs_diff(eager->forward(tokens), sdpa->forward(tokens)), 1e-5);
    EXPECT_NEAR(loss_e.item<double>(), loss_s.item<double>(), 1e-4);
    eager->zero_grad();
    sdpa->zero_grad();
    loss_e.backward();
    loss_s.backward();
    auto pe = eager->named_parameters();
    auto ps = sdpa->named_parameters();
    for (const auto& kv : pe)
      EXPECT_LE(max_abs_diff(kv.value().grad(), ps[kv.key()].grad()), 1e-5) << kv.key();
  }
  // Incremental decoding: the cached path builds a mask (queries offset from keys).
  auto tokens = random_tokens(1, 6, kVocab, 23);
  KVCache ce, cs;
  EXPECT_LE(max_abs_diff(eager->forward_cached(tokens.narrow(1, 0, 4), ce),
                         sdpa->forward_cached(tokens.narrow(1, 0, 4), cs)), 1e-5);
  EXPECT_LE(max_abs_diff(eager->forward_cached(tokens.narrow(1, 4, 2), ce),
                         sdpa->forward_cached(tokens.narrow(1, 4, 2), cs)), 1e-5);
  // bf16 autocast: both round the same matmuls to bf16; they agree to bf16 precision.
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  auto le = eager->forward(padded);
  auto ls = sdpa->forward(padded);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(le.scalar_type(), torch::kBFloat16);  // the head's output under autocast
  EXPECT_EQ(ls.scalar_type(), torch::kBFloat16);
  EXPECT_LE(max_abs_diff(le, ls), 0.1);
}

TEST(AttentionImpl, AutoIsSdpaOnCudaOnly) {
  EXPECT_FALSE(uses_sdpa("auto", torch::Device(torch::kCPU)));
  EXPECT_TRUE(uses_sdpa("auto", torch::Device(torch::kCUDA, 0)));
  EXPECT_TRUE(uses_sdpa("sdpa", torch::Device(torch::kCPU)));
  EXPECT_FALSE(uses_sdpa("eager", torch::Device(torch::kCUDA, 0)));
}

// forward_loss (the fused head on the CPU in float32) against lm_loss_sum over forward's logits:
// the same loss and the same gradient for every parameter up to float32 rounding, with pad
// targets; for llama also with the head tied to the token table. Under bf16 autocast
// (evaluation and training) forward_loss takes the unfused path: the same loss bits.
TEST_P(FamilyTest, ForwardLossEqualsLossOfForward) {
  for (bool tied : {false, true}) {
    if (tied && GetParam() != "llama") continue;
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    ModelConfig c = tiny_config(GetParam());
    c.tie_embeddings = tied;
    auto fused = make_model(c), unfused = make_model(c);
    fused->train();
    unfused->train();
    auto tokens = random_tokens(3, 8, kVocab, 21);
    auto targets = random_tokens(3, 8, kVocab, 22);
    targets[1].narrow(0, 5, 3).zero_();
    auto lf = fused->forward_loss(tokens, targets);
    auto lu = lm_loss_sum(unfused->forward(tokens), targets);
    EXPECT_NEAR(lf.item<double>(), lu.item<double>(), 1e-6 * std::abs(lu.item<double>()));
    (lf * 0.25).backward();
    (lu * 0.25).backward();
    auto pu = unfused->named_parameters();
    for (const auto& p : fused->named_parameters()) {
      const torch::Tensor& gu = pu[p.key()].grad();
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_LE(max_abs_diff(p.value().grad(), gu), 1e-5 * gu.abs().max().item<double>() + 1e-9)
          << p.key();
    }
    {
      CpuBf16Autocast autocast;
      torch::NoGradGuard no_grad;
      EXPECT_EQ(fused->forward_loss(tokens, targets).item<float>(),
                lm_loss_sum(fused->forward(tokens), targets).item<float>());
    }
    // bf16 training takes the unfused path too: the same loss bits.
    {
      CpuBf16Autocast autocast;
      EXPECT_EQ(fused->forward_loss(tokens, targets).item<float>(),
                lm_loss_sum(fused->forward(tokens), targets).item<float>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::Values("minillm", "llama"));

TEST(MiniLLMTest, ParameterCountAndFlopsMatchFormulaAndPeer) {
  // The peer's mini shape: V 4096, d 128, 4 heads, 2 layers, d_ff 256, seq 64. Expected values
  // printed by shared/peer/ddp_ref.py count_params: (1325824, 793344, 4956672).
  ModelConfig c;
  c.type = "minillm";
  c.d_model = 128;
  c.n_heads = 4;
  c.n_layers = 2;
  c.d_ff = 256;
  auto model = make_model(c, 4096, 64);
  const int64_t V = 4096, d = 128, S = 64, L = 2, f = 256;
  const int64_t formula = V * d + S * d + L * (4 * (d * d + d) + 2 * d * f + f + d + 4 * d) + V * d + V;
  EXPECT_EQ(formula, 1325824);
  EXPECT_EQ(model->num_params(), 1325824);
  EXPECT_EQ(model->flops_per_token(64), 4956672);
  EXPECT_EQ(model->flops_per_token(64), 6 * (1325824 - V * d - S * d) + 12 * L * d * 64);
  EXPECT_TRUE(model->is_embedding("tok_emb.weight"));
  EXPECT_TRUE(model->is_embedding("pos_emb.weight"));
  EXPECT_FALSE(model->is_embedding("lm_head.weight"));
  EXPECT_FALSE(model->is_embedding("layers.0.norm1.weight"));

  // d_ff 0 -> 4 d_model; the golden tiny model has 5797 parameters (PyTorch's count).
  auto tiny = make_model(tiny_config("minillm"), 37, 8);
  EXPECT_EQ(dynamic_cast<MiniLLM&>(*tiny).options().d_ff, 64);
  auto golden_shape = tiny_config("minillm");
  golden_shape.d_ff = 32;
  EXPECT_EQ(make_model(golden_shape, 37, 8)->num_params(), 5797);
}

TEST(LlamaTest, FfnHiddenFollowsTheLlamaRule) {
  EXPECT_EQ(LlamaOptions::ffn_hidden(4096, 256), 11008);  // LLaMA-7B
  EXPECT_EQ(LlamaOptions::ffn_hidden(128, 32), 352);      // int(1024/3) = 341 -> 352
  EXPECT_EQ(LlamaOptions::ffn_hidden(16, 16), 48);        // 42 -> 48
  EXPECT_EQ(LlamaOptions::ffn_hidden(288, 32), 768);      // llama2.c stories15M
}

TEST(LlamaTest, ParameterCountsUntiedAndTied) {
  // d 16, 4 heads, 2 kv heads (kv width 8), 2 layers, d_ff 48, V 37: the golden "llama" case,
  // 7408 parameters in PyTorch.
  auto c = tiny_config("llama");
  auto untied = make_model(c, 37, 8);
  const int64_t V = 37, d = 16, L = 2, kv = 8, f = 48;
  const int64_t body = L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d;
  EXPECT_EQ(V * d + body + V * d, 7408);
  EXPECT_EQ(untied->num_params(), 7408);
  EXPECT_EQ(untied->flops_per_token(8), 6 * (7408 - V * d) + 12 * L * d * 8);

  c.tie_embeddings = true;
  auto tied = make_model(c, 37, 8);
  EXPECT_EQ(tied->num_params(), 7408 - V * d);
  EXPECT_EQ(tied->named_parameters().size(), untied->named_parameters().size() - 1);
  EXPECT_FALSE(tied->named_parameters().contains("lm_head.weight"));
  // The tied head still does a V x d matmul per token.
  EXPECT_EQ(tied->flops_per_token(8), untied->flops_per_token(8));
  EXPECT_TRUE(tied->is_embedding("tok_emb.weight"));

  // The shared table gets gradient from both the lookup and the head.
  auto tokens = random_tokens(1, 4, V, 9);
  auto logits = tied->forward(tokens);
  logits.sum().backward();
  auto grad = tied->named_parameters()["tok_emb.weight"].grad();
  EXPECT_GT(grad.abs().sum(-1).gt(0).sum().item<int64_t>(), 4);  // rows beyond the 4 looked up
}

TEST(ModelRegistryTest, BuildsBothFamiliesAndRejectsBadConfigs) {
  test::ensure_models_registered();
  auto names = model_registry().names();
  EXPECT_EQ(names, (std::vector<std::string>{"llama", "minillm"}));
  EXPECT_THROW(model_registry().create("gpt5", ModelConfig{}, 37, 8), ConfigError);

  auto c = tiny_config("llama");
  c.n_kv_heads = 3;  // does not divide 4
  EXPECT_THROW(model_registry().create("llama", c, 37, 8), ConfigError);
  c = tiny_config("llama");
  c.n_heads = 8;  // head size 2: fine
  EXPECT_NO_THROW(model_registry().create("llama", c, 37, 8));
  c.d_model = 24;  // head size 3: odd, RoPE needs pairs
  c.n_kv_heads = 0;
  EXPECT_THROW(model_registry().create("llama", c, 37, 8), ConfigError);
  c = tiny_config("minillm");
  c.tie_embeddings = true;
  EXPECT_THROW(model_registry().create("minillm", c, 37, 8), ConfigError);
  c = tiny_config("minillm");
  c.n_kv_heads = 1;
  EXPECT_THROW(model_registry().create("minillm", c, 37, 8), ConfigError);
  c.n_kv_heads = 0;
  c.n_heads = 3;  // 16 % 3 != 0
  EXPECT_THROW(model_registry().create("minillm", c, 37, 8), ConfigError);
  EXPECT_THROW(model_registry().create("minillm", tiny_config("minillm"), 0, 8), ConfigError);
}

// The autograd node that feeds `weight`'s gradient accumulator in the graph of `out` (null if
// none): the bf16 cast of the weight under autocast.
torch::autograd::Node* node_feeding(const torch::Tensor& out, const torch::Tensor& weight) {
  auto acc = torch::autograd::impl::grad_accumulator(weight);
  std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) {
      if (e.function.get() == acc.get()) return n;
      todo.push_back(e.function.get());
    }
  }
  return nullptr;
}

// Counts the calls of one ATen operator (its profiler name: "aten::cat") while alive; with
// `shape`, only calls whose first input is a tensor of that shape. One counter at a time.
class OpCounter {
 public:
  explicit OpCounter(std::string name, std::vector<int64_t> shape = {})
      : name_(std::move(name)), shape_(std::move(shape)) {
    active_ = this;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              const OpCounter& c = *active_;
              if (c.name_ == fn.name() &&
                  (c.shape_.empty() || (!fn.inputs().empty() && fn.inputs()[0].isTensor() &&
                                        fn.inputs()[0].toTensor().sizes() == c.shape_)))
                ++active_->count_;
              return nullptr;
            })
            .needsInputs(!shape_.empty())
            .scopes({at::RecordScope::FUNCTION}));
  }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  ~OpCounter() {
    at::removeCallback(handle_);
    active_ = nullptr;
  }
  int count() const { return count_; }

 private:
  static inline OpCounter* active_ = nullptr;
  std::string name_;
  std::vector<int64_t> shape_;
  int count_ = 0;
  at::CallbackHandle handle_;
};

TEST(Linear, Bf16AutocastCastsEachWeightOnceWhileItsCacheLives) {
  // Two calls under one autocast cache (two micro-batches of a step) share one bf16 cast of the
  // weight and of the bias, with or without grad mode's bf16_autocast_linear; torch::nn::Linear's
  // own forward (matmul with weight.t(), a view) makes a new cast per call, which is why the
  // models call mllm::linear.
  torch::manual_seed(1);
  torch::nn::Linear layer(8, 4);
  auto x = torch::randn({2, 3, 8});
  torch::Tensor y1, y2, f1, f2;
  int weight_casts = 0, bias_casts = 0;
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  {
    OpCounter weights("aten::_to_copy", {4, 8});  // the weight's casts to bf16
    y1 = linear(layer, x);
    y2 = linear(layer, x);
    weight_casts = weights.count();
  }
  {
    OpCounter biases("aten::_to_copy", {4});
    auto z = linear(layer, x);
    bias_casts = biases.count();  // cached by the calls above: none
  }
  f1 = layer->forward(x);
  f2 = layer->forward(x);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y1.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(weight_casts, 1);
  EXPECT_EQ(bias_casts, 0);
  EXPECT_NE(node_feeding(f1, layer->weight), node_feeding(f2, layer->weight));
  // The value: x @ W^T + b in float64 from the bf16-rounded operands, within bf16's rounding of
  // the result (8 significant bits).
  auto r = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  auto want = torch::matmul(r(x), r(layer->weight).t()) + r(layer->bias);
  EXPECT_TRUE(torch::allclose(y1.to(torch::kDouble), want, /*rtol=*/1.0 / 128, /*atol=*/1e-3));
  EXPECT_TRUE(torch::equal(y1, y2));
}

// Higham's bound for a float32 sum of n products computed exactly (bf16 x bf16 fits float32):
// |error| <= n u / (1 - n u) * sum |terms|, u = 2^-24 (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., eq. 3.5). A gradient rounded to bf16 (u = 2^-9) would not
// meet it at these sizes.
torch::Tensor float32_gemm_bound(const torch::Tensor& abs_terms_sum, int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -24);
  return abs_terms_sum * (nu / (1.0 - nu));
}

// Under Bf16GemmPath::kSgemm, got = round_bf16(x W^T + b) (then max(0, .) with relu) from a
// float32 sum in another order than autocast's: within Higham's bound of the float64 value of the
// bf16 operands plus one bf16 rounding (2^-8 relative: a relative half-unit 2^-9 with margin),
// and equal to autocast's bits `want` in all but a few places (where the two float32 sums round
// to neighbouring bf16 values).
void expect_sgemm_product(const torch::Tensor& got, const torch::Tensor& want,
                          const torch::Tensor& x, const torch::nn::Linear& layer, bool relu) {
  const auto bf = [](const torch::Tensor& t) {
    return t.detach().to(torch::kBFloat16).to(torch::kDouble);
  };
  const int64_t in = layer->weight.size(1);
  const auto x2 = bf(x).reshape({-1, in}), w = bf(layer->weight);
  const auto b = layer->bias.defined() ? bf(layer->bias) : torch::zeros({w.size(0)}, torch::kDouble);
  auto ref = x2.mm(w.t()) + b;
  if (relu) ref = ref.relu();
  const auto bound = float32_gemm_bound(x2.abs().mm(w.abs().t()) + b.abs(), in + 1) +
                     std::ldexp(1.0, -8) * ref.abs();
  const auto err = (got.to(torch::kDouble).reshape(ref.sizes()) - ref).abs();
  EXPECT_TRUE(err.le(bound).all().item<bool>()) << "max error " << err.max().item<double>();
  const double same = got.eq(want).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(same, 0.99) << "equal to autocast's bits: " << same;
}

// Under autocast with grad mode, mllm::linear's forward equals autocast's torch::linear bit for
// bit (on the sgemm path: expect_sgemm_product) (2-D and 3-D inputs, with and without a bias), and its output can be modified in place
// (ReLU in place, then backward) as autocast's can.
TEST(Linear, Bf16AutocastForwardEqualsAutocastsLinear) {
  torch::manual_seed(6);
  for (bool bias : {true, false}) {
    torch::nn::Linear layer(torch::nn::LinearOptions(24, 40).bias(bias));
    for (const auto& shape : {std::vector<int64_t>{7, 24}, std::vector<int64_t>{3, 5, 24}}) {
      auto x = torch::randn(shape, torch::requires_grad());
      CpuBf16Autocast autocast;
      auto got = linear(layer, x);
      auto want = torch::linear(x, layer->weight, layer->bias);
      ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
      if (bf16_gemm_path() == Bf16GemmPath::kSgemm)
        expect_sgemm_product(got, want, x, layer, false);
      else
        EXPECT_TRUE(torch::equal(got, want)) << "bias " << bias << " dims " << shape.size();
      got.relu_();
      got.to(torch::kFloat).sum().backward();
      EXPECT_TRUE(layer->weight.grad().defined());
      EXPECT_TRUE(x.grad().defined());
      layer->zero_grad();
    }
  }
}

// At the small benchmark's shapes (2048 rows; 512 -> 512 x 3, 512 -> 2048 with ReLU, 2048 ->
// 512), the fused forward paths under bf16 autocast with grad mode — one product for Q/K/V
// (linears), oneDNN's bias and ReLU (linear, linear_relu) — equal autocast's own linear and ReLU
// bit for bit. Outside grad mode mllm's layers give the same bits as in it (evaluation, and
// activation checkpointing's first pass, which its recomputation must repeat). Under kSgemm
// (float32 sgemm on widened operands) they are the same products as autocast's summed in another
// order: expect_sgemm_product.
TEST(Linear, FusedForwardsEqualAutocastAtModelShapes) {
  torch::manual_seed(12);
  std::vector<torch::nn::Linear> qkv{torch::nn::Linear(512, 512), torch::nn::Linear(512, 512),
                                     torch::nn::Linear(512, 512)};
  torch::nn::Linear fc1(512, 2048), fc2(2048, 512);
  auto x = torch::randn({8, 256, 512}, torch::requires_grad());
  CpuBf16Autocast autocast;
  auto got = linears(qkv, x);
  auto h = linear_relu(fc1, x);
  auto out = linear(fc2, h);
  torch::NoGradGuard no_grad;
  // Outside grad mode mllm's layers give the same bits (evaluation, and activation
  // checkpointing's first pass, which its recomputation in grad mode must repeat).
  EXPECT_TRUE(torch::equal(linears(qkv, x)[1], got[1]));
  EXPECT_TRUE(torch::equal(linear_relu(fc1, x), h));
  EXPECT_TRUE(torch::equal(linear(fc2, h), out));
  const bool sgemm = bf16_gemm_path() == Bf16GemmPath::kSgemm;
  for (size_t i = 0; i < qkv.size(); ++i) {
    const auto want = torch::linear(x, qkv[i]->weight, qkv[i]->bias);
    if (sgemm)
      expect_sgemm_product(got[i], want, x, qkv[i], false);
    else
      EXPECT_TRUE(torch::equal(got[i], want)) << i;
  }
  auto want_h = torch::relu(torch::linear(x, fc1->weight, fc1->bias));
  // fc2 from the same h, so that its check does not carry h's differences.
  auto want_out = torch::linear(h, fc2->weight, fc2->bias);
  if (sgemm) {
    expect_sgemm_product(h, want_h, x, fc1, true);
    expect_sgemm_product(out, want_out, h, fc2, false);
  } else {
    EXPECT_TRUE(torch::equal(h, want_h));
    EXPECT_TRUE(torch::equal(out, want_out));
  }
}


// Under CPU bf16 autocast with grad mode, the weight gradient of mllm::linear is a float32 GEMM
// result where oneMKL is used (bf16_products_in_mllm), or ATen's bf16 product otherwise; the
// input gradient of a float32 x likewise a float32 product where oneMKL is used (within Higham's
// bound, most elements not bf16 values), else the bf16 product cast to float32; the bias
// gradient a float32 sum; two micro-batches accumulate. References: float64 products of the
// bf16-rounded operands.
TEST(Linear, Bf16AutocastWeightGradientIsFloat32) {
  torch::manual_seed(2);
  torch::nn::Linear layer(64, 32);
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  torch::Tensor want_dw = torch::zeros({32, 64}, torch::kDouble);
  torch::Tensor want_db = torch::zeros({32}, torch::kDouble);
  torch::Tensor bound = torch::zeros({32, 64}, torch::kDouble);
  torch::Tensor bias_bound = torch::zeros({32}, torch::kDouble);
  {
  CpuBf16Autocast autocast;
  for (int micro = 0; micro < 2; ++micro) {
    auto x = torch::randn({3, 50, 64}, torch::requires_grad());
    auto g = torch::randn({3, 50, 32}).to(torch::kBFloat16);
    auto y = linear(layer, x);
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    y.backward(g);
    const auto g2 = bf(g).reshape({-1, 32}), x2 = bf(x.detach()).reshape({-1, 64});
    want_dw += g2.t().mm(x2);
    want_db += g2.sum(0);
    // (n = 301: each micro-batch's 150-term sum, and their float32 sum, count as one sum.)
    bound += float32_gemm_bound(g2.abs().t().mm(x2.abs()), 301);
    bias_bound += float32_gemm_bound(g2.abs().sum(0), 301);
    ASSERT_EQ(x.grad().scalar_type(), torch::kFloat);
    auto want_dx = g2.mm(bf(layer->weight.detach())).view({3, 50, 64});
    const auto dx_err = (x.grad().to(torch::kDouble) - want_dx).abs();
    if (bf16_products_in_mllm()) {
      // dx: oneMKL's float32 product (32 terms), not rounded to bf16.
      const auto dx_bound =
          float32_gemm_bound(g2.abs().mm(bf(layer->weight.detach()).abs()), 32).view({3, 50, 64});
      EXPECT_TRUE(dx_err.le(dx_bound).all().item<bool>())
          << "max error " << dx_err.max().item<double>();
      const auto& dx = x.grad();
      EXPECT_GT(dx.ne(dx.to(torch::kBFloat16).to(torch::kFloat)).sum().item<int64_t>(),
                150 * 64 * 9 / 10);
    } else {
      // dx: the bf16 product, rounded once to bf16 (relative 2^-8 with margin).
      EXPECT_LE(dx_err.max().item<double>(),
                std::ldexp(1.0, -8) * want_dx.abs().max().item<double>());
    }
  }
  }
  ASSERT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
  auto dw = layer->weight.grad().to(torch::kDouble);
  if (bf16_products_in_mllm()) {
    EXPECT_TRUE((dw - want_dw).abs().le(bound).all().item<bool>())
        << "max error " << (dw - want_dw).abs().max().item<double>();
    // Not rounded to bf16 on the way: most elements are not bf16 values.
    auto w = layer->weight.grad();
    EXPECT_GT(w.ne(w.to(torch::kBFloat16).to(torch::kFloat)).sum().item<int64_t>(), 32 * 64 * 9 / 10);
  } else {
    GTEST_LOG_(INFO) << "oneMKL's bf16 GEMM is not used on this CPU / LibTorch: ATen's bf16 product";
    EXPECT_LE((dw - want_dw).abs().max().item<double>(),
              std::ldexp(1.0, -7) * want_dw.abs().max().item<double>());
  }
  auto db = layer->bias.grad().to(torch::kDouble);
  if (bf16_products_in_mllm()) {
    // The bias gradient: a float32 sum (oneMKL), within Higham's bound, not rounded to bf16.
    EXPECT_TRUE((db - want_db).abs().le(bias_bound).all().item<bool>())
        << "max error " << (db - want_db).abs().max().item<double>();
    auto b = layer->bias.grad();
    EXPECT_GT(b.ne(b.to(torch::kBFloat16).to(torch::kFloat)).sum().item<int64_t>(), 32 * 9 / 10);
  } else {
    // ATen's float32 sum of the bf16 gradient, at least as close as one bf16 rounding.
    EXPECT_LE((db - want_db).abs().max().item<double>(),
              std::ldexp(1.0, -7) * want_db.abs().max().item<double>());
  }
}

// The path decision as a function of MLLM_BF16_GEMM, the CPU's flags and the measured rates
// (docs/precision.md): AMX -> oneMKL's bf16 GEMM; else the sgemm path below 0.8 of the fp32 rate;
// else oneMKL's bf16 GEMM with avx512_bf16 where it ran at 0.9 or more of ATen's bf16 GEMM; else
// ATen's; the variable overrides; an unknown value is refused. And this process's path follows
// MLLM_BF16_GEMM where it is set (unit.model_bf16_sgemm sets sgemm).
TEST(Linear, Bf16GemmPathDecision) {
  using P = Bf16GemmPath;
  // Arguments: env, amx_bf16, avx512_bf16, then ATen's bf16, fp32 and oneMKL's bf16 rates.
  EXPECT_EQ(wanted_bf16_gemm_path("", true, true, 0, 0, 0), P::kMkl);
  EXPECT_EQ(wanted_bf16_gemm_path("", true, true, 100, 300, 0), P::kMkl);   // AMX first
  EXPECT_EQ(wanted_bf16_gemm_path("", true, true, 900, 300, 10), P::kMkl);  // whatever oneMKL's
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 160, 320, 163), P::kSgemm);  // 0.50
  EXPECT_EQ(wanted_bf16_gemm_path("", false, false, 1.4, 93, 0), P::kSgemm);   // no bf16 units
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 79, 100, 79), P::kSgemm);   // 0.79
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 80, 100, 0), P::kAten);     // 0.80: not below
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 80, 100, 73), P::kMkl);     // 0.80, oneMKL 0.91
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 100, 100, 90), P::kMkl);    // 0.90: from there
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 869, 238, 0), P::kAten);    // Zen 4: 3.6
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 869, 238, 850), P::kMkl);   // oneMKL 0.98
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 869, 238, 700), P::kAten);  // oneMKL 0.81
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 1000, 238, 899.9), P::kAten);  // just below
  EXPECT_EQ(wanted_bf16_gemm_path("", false, false, 869, 238, 869), P::kAten);  // no avx512_bf16
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 0, 0, 0), P::kAten);        // not measured
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 0, 0, 900), P::kAten);
  EXPECT_EQ(wanted_bf16_gemm_path("", false, true, 160, 0, 160), P::kAten);
  EXPECT_EQ(wanted_bf16_gemm_path("aten", true, true, 0, 0, 0), P::kAten);
  EXPECT_EQ(wanted_bf16_gemm_path("aten", false, true, 869, 238, 900), P::kAten);
  EXPECT_EQ(wanted_bf16_gemm_path("sgemm", true, true, 900, 100, 900), P::kSgemm);
  EXPECT_EQ(wanted_bf16_gemm_path("mkl", false, true, 160, 320, 10), P::kMkl);
  EXPECT_EQ(wanted_bf16_gemm_path("mkl", false, false, 0, 0, 0), P::kAten);  // no bf16 units
  EXPECT_THROW(wanted_bf16_gemm_path("fast", true, true, 0, 0, 0), ConfigError);
  const char* env = std::getenv("MLLM_BF16_GEMM");
  if (env != nullptr && std::string(env) == "sgemm" && mkl_sgemm_available()) {
    EXPECT_EQ(bf16_gemm_path(), P::kSgemm);
    EXPECT_EQ(bf16_gemm_f32(), &sgemm_on_widened_bf16);
    EXPECT_TRUE(bf16_products_in_mllm());
  }
  if (env != nullptr && std::string(env) == "aten") EXPECT_EQ(bf16_gemm_path(), P::kAten);
}

// sgemm_on_widened_bf16 (the sgemm path's product for the fused attention's blocks), called
// directly: every transpose combination, leading dimensions wider than the rows, alpha and a
// beta that keeps C, against float64 of the same bf16 operands within Higham's bound.
TEST(Linear, SgemmOnWidenedBf16AgainstFloat64) {
  if (!mkl_sgemm_available()) GTEST_SKIP() << "libtorch_cpu.so exports no sgemm_";
  torch::manual_seed(21);
  const int m = 37, n = 29, k = 53, pad = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // Stored [m, k] or [k, m] (transposed), [k, n] or [n, k], each with `pad` extra columns.
      const auto a_st = torch::randn({ta ? k : m, (ta ? m : k) + pad}).to(torch::kBFloat16);
      const auto b_st = torch::randn({tb ? n : k, (tb ? k : n) + pad}).to(torch::kBFloat16);
      auto c = torch::randn({m, n + pad});
      const auto c0 = c.to(torch::kDouble);
      const float alpha = 0.75f, beta = 0.5f;
      sgemm_on_widened_bf16(cblas::kRowMajor, ta ? cblas::kTrans : cblas::kNoTrans,
                            tb ? cblas::kTrans : cblas::kNoTrans, m, n, k, alpha,
                            a_st.const_data_ptr(), static_cast<int>(a_st.size(1)),
                            b_st.const_data_ptr(), static_cast<int>(b_st.size(1)), beta,
                            c.data_ptr<float>(), static_cast<int>(c.size(1)));
      auto a = a_st.to(torch::kDouble).narrow(1, 0, ta ? m : k);
      auto b = b_st.to(torch::kDouble).narrow(1, 0, tb ? k : n);
      if (ta) a = a.t();
      if (tb) b = b.t();
      const auto want = alpha * a.mm(b) + beta * c0.narrow(1, 0, n);
      const auto bound =
          float32_gemm_bound(alpha * a.abs().mm(b.abs()) + beta * c0.narrow(1, 0, n).abs(), k + 2);
      const auto err = (c.narrow(1, 0, n).to(torch::kDouble) - want).abs();
      EXPECT_TRUE(err.le(bound).all().item<bool>())
          << "ta " << ta << " tb " << tb << " max error " << err.max().item<double>();
      // The padding columns of C are not written.
      EXPECT_TRUE(torch::equal(c.narrow(1, n, pad), c0.narrow(1, n, pad).to(torch::kFloat)));
    }
}

// On the sgemm path the forward is ATen's float32 product of the widened operands, plus the
// bias, ReLU and one rounding to bf16: bit for bit that composition, NaN and infinities
// included, with an output width that is no multiple of 16 (the rounding pass's tail), in grad
// mode and outside it. Runs where the path is in use (unit.model_bf16_sgemm).
TEST(Linear, SgemmPathForwardIsTheFloat32ProductRoundedOnce) {
  if (bf16_gemm_path() != Bf16GemmPath::kSgemm) GTEST_SKIP() << "not the sgemm path here";
  torch::manual_seed(22);
  torch::nn::Linear layer(48, 40);
  auto x = torch::randn({3, 11, 48});
  x.index_put_({0, 1, 5}, std::numeric_limits<float>::quiet_NaN());
  x.index_put_({1, 2, 7}, std::numeric_limits<float>::infinity());
  x.index_put_({2, 3}, 1e30f);  // large finite products
  for (bool relu : {false, true})
    for (bool grad : {true, false}) {
      torch::Tensor got;
      {
        torch::AutoGradMode mode(grad);
        CpuBf16Autocast autocast;
        got = relu ? linear_relu(layer, x) : linear(layer, x);
      }
      const auto wide = [](const torch::Tensor& t) {
        return t.detach().to(torch::kBFloat16).to(torch::kFloat);
      };
      auto want = at::mm(wide(x).reshape({-1, 48}), wide(layer->weight).t()) + wide(layer->bias);
      if (relu) want = want.relu();
      want = want.to(torch::kBFloat16).view({3, 11, 40});
      ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(got.isnan(), want.isnan())) << "relu " << relu << " grad " << grad;
      EXPECT_TRUE(torch::equal(got.nan_to_num(0), want.nan_to_num(0)))
          << "relu " << relu << " grad " << grad;
      EXPECT_GT(got.isnan().sum().item<int64_t>(), 0);
      EXPECT_GT(got.isinf().sum().item<int64_t>(), 0);
    }
}

TEST(Linear, WeightGradFloat32AgainstFloat64AndItsErrors) {
  torch::manual_seed(4);
  auto g = torch::randn({777, 40}).to(torch::kBFloat16);
  auto x = torch::randn({777, 96}).to(torch::kBFloat16);
  auto dw = weight_grad_float32(g, x);
  ASSERT_EQ(dw.scalar_type(), torch::kFloat);
  ASSERT_EQ(dw.sizes(), (std::vector<int64_t>{40, 96}));
  auto gd = g.to(torch::kDouble), xd = x.to(torch::kDouble);
  auto err = (dw.to(torch::kDouble) - gd.t().mm(xd)).abs();
  if (bf16_products_in_mllm()) {
    EXPECT_TRUE(err.le(float32_gemm_bound(gd.abs().t().mm(xd.abs()), 777)).all().item<bool>())
        << "max error " << err.max().item<double>();
  }
  // A transposed (non-contiguous) operand; zero rows give 0, zero columns an empty result.
  auto gt = torch::randn({40, 777}).to(torch::kBFloat16).t();
  auto gtd = gt.to(torch::kDouble);
  auto err_t = (weight_grad_float32(gt, x).to(torch::kDouble) - gtd.t().mm(xd)).abs();
  if (bf16_products_in_mllm())
    EXPECT_TRUE(err_t.le(float32_gemm_bound(gtd.abs().t().mm(xd.abs()), 777)).all().item<bool>());
  EXPECT_TRUE(weight_grad_float32(g.narrow(0, 0, 0), x.narrow(0, 0, 0)).eq(0).all().item<bool>());
  EXPECT_EQ(weight_grad_float32(g.narrow(1, 0, 0), x).sizes(), (std::vector<int64_t>{0, 96}));
  EXPECT_THROW(weight_grad_float32(g.to(torch::kFloat), x), Error);
  EXPECT_THROW(weight_grad_float32(g, x.narrow(0, 0, 5)), Error);
}

// linear_relu is relu(linear) with the same values: bit for bit against autocast's linear and
// ReLU under bf16 autocast (oneDNN's fused ReLU acts before the rounding, which commutes with
// it), and exactly in float32. Its gradients under bf16 autocast against float64 references
// through ReLU's mask: the weight and bias gradients within Higham's float32 bound (oneMKL) or
// a bf16 rounding, the input gradient within a bf16 rounding. An in-place change of its output
// makes the backward throw (the output is saved for it).
TEST(Linear, ReluFusedEqualsReluOfLinear) {
  torch::manual_seed(8);
  torch::nn::Linear layer(48, 40);
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  auto x = torch::randn({4, 30, 48}, torch::requires_grad());
  EXPECT_TRUE(torch::equal(linear_relu(layer, x), torch::relu(linear(layer, x))));
  torch::Tensor y;
  {
    CpuBf16Autocast autocast;
    y = linear_relu(layer, x);
    auto want = torch::relu(torch::linear(x, layer->weight, layer->bias));
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(y, want));
    EXPECT_GT(y.eq(0).sum().item<int64_t>(), y.numel() / 4);  // the mask matters
  }
  auto g = torch::randn({4, 30, 40}).to(torch::kBFloat16);
  y.backward(g);
  const auto mask = y.detach().gt(0).to(torch::kDouble).reshape({-1, 40});
  const auto g2 = bf(g).reshape({-1, 40}) * mask, x2 = bf(x.detach()).reshape({-1, 48});
  const auto want_dw = g2.t().mm(x2), want_db = g2.sum(0);
  const auto want_dx = g2.mm(bf(layer->weight.detach())).view({4, 30, 48});
  auto dw = layer->weight.grad().to(torch::kDouble), db = layer->bias.grad().to(torch::kDouble);
  if (bf16_products_in_mllm()) {
    EXPECT_TRUE((dw - want_dw).abs().le(float32_gemm_bound(g2.abs().t().mm(x2.abs()), 120)).all().item<bool>());
    EXPECT_TRUE((db - want_db).abs().le(float32_gemm_bound(g2.abs().sum(0), 120)).all().item<bool>());
  } else {
    EXPECT_LE((dw - want_dw).abs().max().item<double>(),
              std::ldexp(1.0, -7) * want_dw.abs().max().item<double>());
    EXPECT_LE((db - want_db).abs().max().item<double>(),
              std::ldexp(1.0, -7) * want_db.abs().max().item<double>());
  }
  EXPECT_LE((x.grad().to(torch::kDouble) - want_dx).abs().max().item<double>(),
            std::ldexp(1.0, -8) * want_dx.abs().max().item<double>());
  if (bf16_products_in_mllm()) {
    CpuBf16Autocast autocast;
    auto z = linear_relu(layer, x);
    z.mul_(2);
    EXPECT_THROW(z.to(torch::kFloat).sum().backward(), c10::Error);
  }
}

// linears: several layers on one x. Under bf16 autocast with grad mode one product over the
// concatenated weights; its outputs equal the layers' own bf16 linear bit for bit (each output
// is the same dot product), with and without biases and with differing widths (grouped K/V).
// Gradients against float64 references of the bf16-rounded operands: weights and biases within
// Higham's float32 bound (oneMKL) or a bf16 rounding; x's gradient, the sum over the layers,
// within Higham's bound for the whole product (oneMKL) or bf16 roundings (as separate layers). An
// output that no loss reads gets zero gradient. Without autocast: the layers' float32 linear,
// exactly.
TEST(Linear, FusedLinearsEqualSeparateLinears) {
  torch::manual_seed(10);
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  for (bool bias : {true, false}) {
    std::vector<torch::nn::Linear> layers;
    for (int64_t out : {40, 16, 24})
      layers.emplace_back(torch::nn::LinearOptions(32, out).bias(bias));
    auto x = torch::randn({3, 20, 32}, torch::requires_grad());
    // (float32: one product over the concatenated weights, within float32 rounding of the
    // separate layers': Linear.Float32LinearsAgainstFloat64AndAdjacentGradients.)
    std::vector<torch::Tensor> got;
    {
      CpuBf16Autocast autocast;
      got = linears(layers, x);
      for (size_t i = 0; i < layers.size(); ++i) {
        ASSERT_EQ(got[i].scalar_type(), torch::kBFloat16);
        EXPECT_TRUE(torch::equal(got[i], torch::linear(x, layers[i]->weight, layers[i]->bias)))
            << "bias " << bias << " layer " << i;
      }
    }
    // The loss reads outputs 0 and 2; output 1's layer gets zero gradients.
    std::vector<torch::Tensor> g;
    for (int64_t out : {40, 16, 24}) g.push_back(torch::randn({3, 20, out}).to(torch::kBFloat16));
    torch::autograd::backward({got[0], got[2]}, {g[0], g[2]});
    const auto x2 = bf(x.detach()).reshape({-1, 32});
    auto want_dx = torch::zeros({60, 32}, torch::kDouble);
    for (size_t i : {0u, 2u}) {
      const auto g2 = bf(g[i]).reshape({60, -1});
      const auto& layer = layers[i];
      want_dx += g2.mm(bf(layer->weight.detach()));
      const auto dw = layer->weight.grad().to(torch::kDouble);
      const auto dw_err = (dw - g2.t().mm(x2)).abs();
      if (bf16_products_in_mllm())
        EXPECT_TRUE(dw_err.le(float32_gemm_bound(g2.abs().t().mm(x2.abs()), 60)).all().item<bool>()) << i;
      else
        EXPECT_LE(dw_err.max().item<double>(), std::ldexp(1.0, -7) * g2.t().mm(x2).abs().max().item<double>());
      if (bias) {
        const auto db_err = (layer->bias.grad().to(torch::kDouble) - g2.sum(0)).abs();
        if (bf16_products_in_mllm())
          EXPECT_TRUE(db_err.le(float32_gemm_bound(g2.abs().sum(0), 60)).all().item<bool>()) << i;
        else
          EXPECT_LE(db_err.max().item<double>(), std::ldexp(1.0, -7) * g2.sum(0).abs().max().item<double>());
      }
    }
    // (Fused, the unread output's layer gets zeros; as separate layers, where oneMKL's bf16 GEMM
    // is not in use, no gradient at all.)
    const auto zero_or_none = [](const torch::Tensor& grad) {
      return bf16_products_in_mllm() ? grad.defined() && grad.eq(0).all().item<bool>()
                                         : !grad.defined() || grad.eq(0).all().item<bool>();
    };
    EXPECT_TRUE(zero_or_none(layers[1]->weight.grad()));
    if (bias) EXPECT_TRUE(zero_or_none(layers[1]->bias.grad()));
    ASSERT_EQ(x.grad().scalar_type(), torch::kFloat);
    const auto dx_err = (x.grad().to(torch::kDouble).reshape({60, 32}) - want_dx).abs();
    if (bf16_products_in_mllm()) {
      // One float32 product over the gradients side by side (80 terms, output 1's zeros
      // included), not rounded to bf16.
      auto terms = torch::zeros({60, 32}, torch::kDouble);
      for (size_t i : {0u, 2u})
        terms += bf(g[i]).reshape({60, -1}).abs().mm(bf(layers[i]->weight.detach()).abs());
      EXPECT_TRUE(dx_err.le(float32_gemm_bound(terms, 80)).all().item<bool>())
          << "max error " << dx_err.max().item<double>();
    } else {
      // Autocast's separate layers: each layer's product rounded to bf16 (u = 2^-8), and, x
      // being a leaf that autocast casts once for both, the two summed in bf16 by autograd
      // (one more rounding) before the cast to float32: within 2^-7 of the sum of the
      // products' magnitudes.
      auto magnitudes = torch::zeros({60, 32}, torch::kDouble);
      for (size_t i : {0u, 2u})
        magnitudes += bf(g[i]).reshape({60, -1}).mm(bf(layers[i]->weight.detach())).abs();
      EXPECT_TRUE(dx_err.le(magnitudes * std::ldexp(1.0, -7)).all().item<bool>())
          << "max error " << dx_err.max().item<double>();
    }
  }
  // Direct calls: a bias count other than 0 or one per weight, differing in-features.
  torch::nn::Linear a(8, 4), c(6, 4);
  auto x = torch::randn({5, 8});
  CpuBf16Autocast autocast;
  EXPECT_THROW(bf16_autocast_linears(x, {a->weight, a->weight}, {a->bias}), Error);
  EXPECT_THROW(bf16_autocast_linears(x, {a->weight, c->weight}, {}), Error);
}

// linears(layers, x0) (under CPU bf16 autocast with `bf16`), then its backward with output i's
// gradient g[i]; *cats gets the number of aten::cat calls in the backward -> {x's gradient, each
// layer's weight and bias gradients}.
std::vector<torch::Tensor> linears_grads(std::vector<torch::nn::Linear>& layers,
                                         const torch::Tensor& x0,
                                         const std::vector<torch::Tensor>& g, bool bf16,
                                         int* cats) {
  for (auto& l : layers) l->zero_grad();
  auto x = x0.clone().requires_grad_(true);
  std::vector<torch::Tensor> y;
  {
    std::optional<CpuBf16Autocast> autocast;
    if (bf16) autocast.emplace();
    y = linears(layers, x);
  }
  OpCounter cat("aten::cat");
  torch::autograd::backward(y, g);
  *cats = cat.count();
  std::vector<torch::Tensor> r{x.grad()};
  for (auto& l : layers) {
    r.push_back(l->weight.grad());
    r.push_back(l->bias.grad());
  }
  return r;
}

// linears' backward reads its outputs' gradients as one matrix where they lie side by side in one
// buffer, in order (as the fused CPU attention's backward leaves dq, dk and dv): no concatenation,
// and every gradient (x's, the weights', the biases') equal bit for bit to the same backward
// given each output's gradient as its own contiguous copy. Gradients in one buffer but out of
// order, or with a gap between them, are concatenated, with the same values as their copies.
// (Only where linears is one fused product: oneMKL's bf16 GEMM in use.)
TEST(Linear, FusedLinearsReadAdjacentGradientsWithoutCopy) {
  if (!bf16_products_in_mllm())
    GTEST_SKIP() << "linears is not fused here (no oneMKL bf16 GEMM)";
  torch::manual_seed(14);
  const std::vector<int64_t> outs{48, 16, 16};
  std::vector<torch::nn::Linear> layers;
  for (int64_t out : outs) layers.emplace_back(torch::nn::LinearOptions(32, out));
  const auto x0 = torch::randn({2, 10, 32});
  const auto buffer = torch::randn({2, 10, 88}).to(torch::kBFloat16);
  // Where output i's gradient starts in `buffer`: in order, in order with a gap of 8 after the
  // first, out of order (the second first).
  const std::vector<std::vector<int64_t>> layouts{{0, 48, 64}, {0, 56, 72}, {16, 0, 64}};
  auto run = [&](const std::vector<int64_t>& start, bool copies, int* cats) {
    std::vector<torch::Tensor> g;
    for (size_t i = 0; i < outs.size(); ++i) {
      g.push_back(buffer.narrow(2, start[i], outs[i]));
      if (copies) g.back() = g.back().contiguous();
    }
    return linears_grads(layers, x0, g, /*bf16=*/true, cats);
  };
  for (size_t k = 0; k < layouts.size(); ++k) {
    int cats = -1, copy_cats = -1;
    const auto got = run(layouts[k], false, &cats), want = run(layouts[k], true, &copy_cats);
    EXPECT_EQ(cats, k == 0 ? 0 : 1) << "layout " << k;
    EXPECT_EQ(copy_cats, 1) << "layout " << k;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(torch::equal(got[i], want[i])) << "layout " << k << " gradient " << i;
  }
}

// The float32 CPU training linear (kernels/cpu/f32_linear.h): forward values bit for bit
// torch::linear's (and relu's of it), in grad mode and out of it; gradients against float64 within
// Higham's bound for a float32 product (n terms: n u / (1 - n u) times the sum of the terms'
// magnitudes); ReLU's gradient zero where the output is 0.
TEST(Linear, Float32LinearEqualsTorchLinearAndGradientsAgainstFloat64) {
  torch::manual_seed(21);
  for (bool bias : {true, false}) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bias " << bias << " relu " << relu);
      torch::nn::Linear layer(torch::nn::LinearOptions(48, 40).bias(bias));
      if (bias) layer->bias.data().normal_();
      const auto x0 = torch::randn({3, 50, 48});
      auto x = x0.clone().requires_grad_(true);
      const auto y = relu ? linear_relu(layer, x) : linear(layer, x);
      ASSERT_NE(y.grad_fn(), nullptr);
      EXPECT_NE(y.grad_fn()->name().find("F32Linear"), std::string::npos) << y.grad_fn()->name();
      torch::Tensor want = torch::linear(x0, layer->weight.detach(),
                                         bias ? layer->bias.detach() : torch::Tensor());
      if (relu) want = torch::relu(want);
      EXPECT_TRUE(torch::equal(y.detach(), want));
      {
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(torch::equal(relu ? linear_relu(layer, x0) : linear(layer, x0), want));
      }
      const auto g = torch::randn({3, 50, 40});
      y.backward(g);
      // float64: g masked by ReLU where the float32 output is 0 (the same mask either way).
      auto gd = g.to(torch::kDouble).reshape({150, 40});
      if (relu) gd = gd * want.reshape({150, 40}).gt(0).to(torch::kDouble);
      const auto xd = x0.to(torch::kDouble).reshape({150, 48});
      const auto wd = layer->weight.detach().to(torch::kDouble);
      const auto dx_err = (x.grad().to(torch::kDouble).reshape({150, 48}) - gd.mm(wd)).abs();
      EXPECT_TRUE(dx_err.le(float32_gemm_bound(gd.abs().mm(wd.abs()), 40)).all().item<bool>())
          << "dx max error " << dx_err.max().item<double>();
      const auto dw_err = (layer->weight.grad().to(torch::kDouble) - gd.t().mm(xd)).abs();
      EXPECT_TRUE(dw_err.le(float32_gemm_bound(gd.abs().t().mm(xd.abs()), 150)).all().item<bool>())
          << "dw max error " << dw_err.max().item<double>();
      if (bias) {
        const auto db_err = (layer->bias.grad().to(torch::kDouble) - gd.sum(0)).abs();
        EXPECT_TRUE(db_err.le(float32_gemm_bound(gd.abs().sum(0), 150)).all().item<bool>());
      }
      if (relu) {  // rows of zeros in the output pass no gradient to the weight
        const auto dead = want.reshape({150, 40}).le(0).all(0);  // [40]
        if (dead.any().item<bool>())
          EXPECT_TRUE(layer->weight.grad().index({dead}).eq(0).all().item<bool>());
      }
    }
  }
  // With ReLU the output is saved for the backward: changing it in place makes the backward
  // throw (autograd's version check) rather than use the changed values.
  {
    torch::nn::Linear layer(8, 4);
    auto y = linear_relu(layer, torch::randn({3, 8}, torch::requires_grad()));
    y.mul_(2);
    EXPECT_ANY_THROW(y.sum().backward());
    auto z = linear(layer, torch::randn({3, 8}, torch::requires_grad()));
    z.mul_(2);  // no ReLU: nothing of the output is saved, and in place is fine
    EXPECT_NO_THROW(z.sum().backward());
  }
  // Errors: a bf16 x, in-features that differ from the weight's, a bias of the wrong size.
  const auto w = torch::randn({4, 8});
  EXPECT_THROW(f32_linear(torch::randn({2, 8}).to(torch::kBFloat16), w, {}), Error);
  EXPECT_THROW(f32_linear(torch::randn({2, 6}), w, {}), Error);
  EXPECT_THROW(f32_linear(torch::randn({2, 8}), w, torch::zeros({5})), Error);
  EXPECT_THROW(f32_linears(torch::randn({2, 8}), {w, w}, {torch::zeros({4})}), Error);
  EXPECT_THROW(f32_linears(torch::randn({2, 8}), {w, torch::randn({4, 6})}, {}), Error);
}

// f32_linears (linears on the float32 CPU path): one product over the concatenated weights,
// outputs within float32 rounding of the separate layers' (the same up to the product's
// blocking), gradients against float64; an output no loss reads gives its layer zero gradients;
// gradients lying side by side in one buffer in order (as the fused CPU attention leaves dq, dk,
// dv) are read without a concatenation, with the same bits as their contiguous copies.
TEST(Linear, Float32LinearsAgainstFloat64AndAdjacentGradients) {
  torch::manual_seed(22);
  const std::vector<int64_t> outs{48, 16, 16};
  for (bool bias : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "bias " << bias);
    std::vector<torch::nn::Linear> layers;
    for (int64_t out : outs) layers.emplace_back(torch::nn::LinearOptions(32, out).bias(bias));
    const auto x0 = torch::randn({2, 10, 32});
    auto x = x0.clone().requires_grad_(true);
    const auto y = linears(layers, x);
    const auto xd = x0.to(torch::kDouble).reshape({20, 32});
    for (size_t i = 0; i < outs.size(); ++i) {
      const auto wd = layers[i]->weight.detach().to(torch::kDouble);
      auto want = xd.mm(wd.t());
      auto terms = xd.abs().mm(wd.abs().t());
      if (bias) {
        want += layers[i]->bias.detach().to(torch::kDouble);
        terms += layers[i]->bias.detach().to(torch::kDouble).abs();
      }
      const auto err = (y[i].detach().to(torch::kDouble).reshape({20, outs[i]}) - want).abs();
      EXPECT_TRUE(err.le(float32_gemm_bound(terms, 33)).all().item<bool>()) << i;
    }
    // The loss reads outputs 0 and 2.
    const auto g0 = torch::randn({2, 10, 48}), g2 = torch::randn({2, 10, 16});
    torch::autograd::backward({y[0], y[2]}, {g0, g2});
    const auto g0d = g0.to(torch::kDouble).reshape({20, 48}),
               g2d = g2.to(torch::kDouble).reshape({20, 16});
    const auto w0 = layers[0]->weight.detach().to(torch::kDouble),
               w2 = layers[2]->weight.detach().to(torch::kDouble);
    const auto dx_err =
        (x.grad().to(torch::kDouble).reshape({20, 32}) - g0d.mm(w0) - g2d.mm(w2)).abs();
    EXPECT_TRUE(dx_err.le(float32_gemm_bound(g0d.abs().mm(w0.abs()) + g2d.abs().mm(w2.abs()), 80))
                    .all()
                    .item<bool>());
    for (size_t i : {0u, 2u}) {
      const auto& gd = i == 0 ? g0d : g2d;
      const auto dw_err = (layers[i]->weight.grad().to(torch::kDouble) - gd.t().mm(xd)).abs();
      EXPECT_TRUE(dw_err.le(float32_gemm_bound(gd.abs().t().mm(xd.abs()), 20)).all().item<bool>());
      if (bias) {
        const auto db_err = (layers[i]->bias.grad().to(torch::kDouble) - gd.sum(0)).abs();
        EXPECT_TRUE(db_err.le(float32_gemm_bound(gd.abs().sum(0), 20)).all().item<bool>());
      }
    }
    EXPECT_TRUE(layers[1]->weight.grad().eq(0).all().item<bool>());
    if (bias) EXPECT_TRUE(layers[1]->bias.grad().eq(0).all().item<bool>());
    // Without grad mode: the same bits as with it.
    torch::NoGradGuard no_grad;
    const auto again = linears(layers, x0);
    for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(torch::equal(again[i], y[i])) << i;
  }
  // Adjacent gradients: read in place (no aten::cat of them), the same bits as contiguous copies.
  std::vector<torch::nn::Linear> layers;
  for (int64_t out : outs) layers.emplace_back(torch::nn::LinearOptions(32, out));
  const auto x0 = torch::randn({2, 10, 32});
  const auto buffer = torch::randn({2, 10, 80});
  auto run = [&](bool copies, int* cats) {
    std::vector<torch::Tensor> g;
    for (size_t i = 0, at = 0; i < outs.size(); at += outs[i], ++i) {
      g.push_back(buffer.narrow(2, static_cast<int64_t>(at), outs[i]));
      if (copies) g.back() = g.back().contiguous();
    }
    return linears_grads(layers, x0, g, /*bf16=*/false, cats);
  };
  // (The backward concatenates the saved weights once either way: one aten::cat more.)
  int cats = -1, copy_cats = -1;
  const auto got = run(false, &cats), want = run(true, &copy_cats);
  EXPECT_EQ(cats, 1);
  EXPECT_EQ(copy_cats, 2);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << i;
}

// ReLU's gradient on bit patterns against PyTorch's threshold_backward(g, y, 0), for every one of
// the 65,536 bf16 values of y (zeros of both signs, subnormals, infinities, NaNs of both signs),
// with a non-contiguous g, and on a length that is not a multiple of any vector width.
TEST(Linear, ReluGradBf16EqualsThresholdBackwardOnEveryValue) {
  torch::manual_seed(11);
  auto bits = torch::arange(65536, torch::kInt).to(torch::kShort);  // wraps to int16's range
  auto y = bits.view(torch::kBFloat16).reshape({256, 256});
  auto g = torch::randn({256, 256}).to(torch::kBFloat16).t();
  ASSERT_TRUE(y.view({-1}).view(torch::kShort).eq(0).any().item<bool>());  // +0 is there
  auto odd = relu_grad_bf16(g.narrow(1, 0, 255), y.narrow(1, 0, 255));
  EXPECT_TRUE(torch::equal(odd.view(torch::kShort),
                           at::threshold_backward(g.narrow(1, 0, 255), y.narrow(1, 0, 255), 0)
                               .contiguous()
                               .view(torch::kShort)));
  auto got = relu_grad_bf16(g, y);
  auto want = at::threshold_backward(g, y, 0);
  EXPECT_TRUE(torch::equal(got.view(torch::kShort), want.contiguous().view(torch::kShort)));
  EXPECT_THROW(relu_grad_bf16(g.to(torch::kFloat), y), Error);
  EXPECT_THROW(relu_grad_bf16(g, y.narrow(1, 0, 5)), Error);
}

TEST(Linear, BiasGradFloat32AgainstFloat64AndItsErrors) {
  torch::manual_seed(9);
  auto g = torch::randn({777, 40}).to(torch::kBFloat16);
  auto gd = g.to(torch::kDouble);
  auto db = bias_grad_float32(g);
  ASSERT_EQ(db.scalar_type(), torch::kFloat);
  ASSERT_EQ(db.sizes(), (std::vector<int64_t>{40}));
  EXPECT_TRUE((db.to(torch::kDouble) - gd.sum(0)).abs().le(float32_gemm_bound(gd.abs().sum(0), 777)).all().item<bool>());
  auto gt = torch::randn({40, 777}).to(torch::kBFloat16).t();  // non-contiguous
  EXPECT_TRUE((bias_grad_float32(gt).to(torch::kDouble) - gt.to(torch::kDouble).sum(0))
                  .abs().le(float32_gemm_bound(gt.to(torch::kDouble).abs().sum(0), 777)).all().item<bool>());
  EXPECT_TRUE(bias_grad_float32(g.narrow(0, 0, 0)).eq(0).all().item<bool>());
  EXPECT_EQ(bias_grad_float32(g.narrow(1, 0, 0)).sizes(), (std::vector<int64_t>{0}));
  EXPECT_THROW(bias_grad_float32(g.to(torch::kFloat)), Error);
  EXPECT_THROW(bias_grad_float32(g.view({-1})), Error);
}

// Eager attention under bf16 autocast adds the mask as a bias (0 / -1e9) instead of masked_fill:
// the reference here is the masked_fill formula written out with the same parameters and ops.
// Outputs agree bit for bit, also in rows where every key is masked (uniform attention), and so
// do the weights' gradients from a loss that reads no such row (as training's loss reads no padding
// query). A mask shared by the batch goes through baddbmm (the bias inside the product, and a
// power-of-two scale as its alpha). Masks
// in a row, and one changed in place, check that a cached bias is not reused.
TEST(AttentionImpl, Bf16MaskBiasEqualsMaskedFill) {
  // head_dim 8 (scale 1/sqrt(8), applied to q) and 16 (scale 1/4, the GEMM's alpha).
  for (const int64_t hd : {8, 16}) {
  SCOPED_TRACE("head_dim " + std::to_string(hd));
  torch::manual_seed(3);
  AttentionOptions o;
  o.d_model = 2 * hd;
  o.n_heads = 2;
  o.n_kv_heads = 2;
  Attention attn(o);
  const int64_t b = 2, t = 5, h = 2;
  auto reference = [&](const torch::Tensor& x, const torch::Tensor& blocked) {
    auto heads = [&](const torch::nn::Linear& p) {
      return linear(p, x).view({b, t, h, hd}).transpose(1, 2);
    };
    auto scores = torch::matmul(heads(attn->q_proj) * (1.0 / std::sqrt(static_cast<double>(hd))),
                                heads(attn->k_proj).transpose(-2, -1));
    scores.masked_fill_(blocked, -1e9);
    auto out = torch::matmul(torch::softmax(scores, -1), heads(attn->v_proj));
    return linear(attn->o_proj, out.transpose(1, 2).reshape({b, t, h * hd}));
  };
  // Row 0 padded on the right (keys 3, 4), row 1 on the left (keys 0, 1): row 1's queries 0
  // and 1 see no key at all.
  auto key_pad = torch::zeros({b, t}, torch::kBool);
  key_pad.index_put_({0, torch::indexing::Slice(3, 5)}, true);
  key_pad.index_put_({1, torch::indexing::Slice(0, 2)}, true);
  auto padded = blocked_mask(key_pad, t, 0);                         // [2, 1, 5, 5]
  auto causal = blocked_mask(torch::zeros({b, t}, torch::kBool), t, 0);
  // No padding: one [1, 1, t, t] mask for the batch, which enters the scores' product (baddbmm).
  auto shared = attention_mask(torch::zeros({b, t}, torch::kBool), t, 0, /*sdpa=*/false);
  ASSERT_EQ(shared.size(0), 1);
  auto reads = torch::ones({b, t, 1});  // the loss's weight per query: 0 for row 1's first two
  reads.index_put_({1, torch::indexing::Slice(0, 2)}, 0.0);
  auto w = torch::randn({b, t, o.d_model});
  CpuBf16Autocast autocast;
  for (const auto& blocked : {padded, causal, shared, padded}) {
    auto x = torch::randn({b, t, o.d_model});
    auto got = attn->forward(x, blocked, nullptr, 0);
    auto want = reference(x, blocked);
    ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got, want));
    // The weights' gradients: each weight's bf16 cast is used once, so they are exact; x's
    // sums three bf16 branches in the cast's buffer, in an order that follows the graph.
    const std::vector<torch::Tensor> weights{attn->q_proj->weight, attn->k_proj->weight,
                                             attn->v_proj->weight, attn->o_proj->weight};
    auto g = torch::autograd::grad({(got.to(torch::kFloat) * w * reads).sum()}, weights);
    auto r = torch::autograd::grad({(want.to(torch::kFloat) * w * reads).sum()}, weights);
    for (size_t i = 0; i < weights.size(); ++i) EXPECT_TRUE(torch::equal(g[i], r[i])) << i;
  }
  // The same mask tensor changed in place: the bias follows it.
  padded.index_put_({0, 0, 4, 0}, true);  // query 4 of row 0 no longer sees key 0
  auto x = torch::randn({b, t, o.d_model});
  EXPECT_TRUE(torch::equal(attn->forward(x, padded, nullptr, 0), reference(x, padded)));
  }
}

// In training under CPU bf16 autocast with the fused attention (no rotary embedding between the
// Q/K/V product and the attention), the backward pass reads dq, dk and dv where the attention
// left them: no concatenation anywhere in it (before, one per layer call), for multi-head and
// grouped key/value heads. The values of that path are checked by
// Linear.FusedLinearsReadAdjacentGradientsWithoutCopy and the CpuAttention tests.
TEST(AttentionImpl, FusedBf16BackwardCopiesNoQkvGradients) {
  if (!cpu_attention_available(torch::kBFloat16))
    GTEST_SKIP() << "no fused CPU bf16 attention here";
  for (const int64_t kvh : {4, 2}) {
    torch::manual_seed(8);
    AttentionOptions o;
    o.d_model = 64;
    o.n_heads = 4;
    o.n_kv_heads = kvh;
    o.attn_dropout = 0.1;
    Attention attn(o);
    attn->train();
    const int64_t b = 2, t = 24;
    auto x = torch::randn({b, t, o.d_model}, torch::requires_grad());
    const auto blocked = attention_mask(torch::zeros({b, t}, torch::kBool), t, 0, /*sdpa=*/false);
    torch::Tensor y;
    {
      CpuBf16Autocast autocast;
      y = attn->forward(x, blocked, nullptr, 0);
    }
    OpCounter cat("aten::cat");
    y.to(torch::kFloat).square().sum().backward();
    EXPECT_EQ(cat.count(), 0) << "kv heads " << kvh;
    for (const auto* w : {&attn->q_proj->weight, &attn->k_proj->weight, &attn->v_proj->weight})
      EXPECT_TRUE(w->grad().defined() && w->grad().isfinite().all().item<bool>() &&
                  w->grad().abs().sum().item<double>() > 0);
  }
}

TEST(LossTest, HandComputedCrossEntropy) {
  // Row 0: uniform logits over 4 tokens -> ln 4 per target. Row 1: logits ln(1..4) -> softmax
  // (0.1, 0.2, 0.3, 0.4); target 3 -> -ln 0.4. Pad targets (0) are skipped.
  auto logits = torch::zeros({2, 2, 4});
  logits[1][0] = torch::log(torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  auto targets = torch::tensor({2, 0, 3, 0}, torch::kLong).view({2, 2});
  EXPECT_NEAR(lm_loss_sum(logits, targets).item<double>(), std::log(4.0) - std::log(0.4), 1e-6);
  EXPECT_EQ(count_targets(targets), 2);
  EXPECT_THROW(lm_loss_sum(logits, targets.view({4})), Error);
  EXPECT_THROW(lm_loss_sum(logits, targets.to(torch::kInt)), Error);
  // bf16 logits are upcast before the log-softmax.
  EXPECT_EQ(lm_loss_sum(logits.to(torch::kBFloat16), targets).scalar_type(), torch::kFloat);
}

TEST(LossTest, HandComputedGradientAndChunkBoundaries) {
  // d/dx of the summed loss is softmax(x) - onehot(target) on real rows, 0 on pad rows, times
  // the upstream gradient. Row 1 of the first sequence: softmax (0.1, 0.2, 0.3, 0.4) with
  // target 3 -> (0.1, 0.2, 0.3, -0.6); the uniform row with target 2 -> (0.25, 0.25, -0.75,
  // 0.25). Upstream gradient 2 (the trainer's loss scale).
  auto logits = torch::zeros({2, 2, 4});
  logits[1][0] = torch::log(torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  logits.requires_grad_(true);
  auto targets = torch::tensor({2, 0, 3, 0}, torch::kLong).view({2, 2});
  (lm_loss_sum(logits, targets) * 2.0).backward();
  auto expected = torch::zeros({2, 2, 4});
  expected[0][0] = torch::tensor({0.5f, 0.5f, -1.5f, 0.5f});
  expected[1][0] = torch::tensor({0.2f, 0.4f, 0.6f, -1.2f});
  EXPECT_LE((logits.grad() - expected).abs().max().item<double>(), 1e-6);

  // On the CPU the loss keeps the logits, not a softmax buffer that becomes the gradient: a
  // second backward through it (retain_graph) gives the same gradient again (upstream 1 here).
  auto again = lm_loss_sum(logits, targets);
  for (bool retain : {true, false}) {
    logits.mutable_grad().zero_();
    again.backward(torch::Tensor(), retain);
    EXPECT_LE((logits.grad() - expected / 2).abs().max().item<double>(), 1e-6) << retain;
  }

  // Many rows of a wide vocabulary (on a GPU, several chunks of 2^18 logits, a ragged last
  // one; on the CPU rows split among threads): value and gradient against float64 log-softmax
  // computed by the formula, not by this code.
  const int64_t rows = 301, vocab = 3000;
  torch::manual_seed(20261207);  // the same logits every run (unseeded, a rare draw broke 1e-6)
  auto x = torch::randn({1, rows, vocab}, torch::kDouble) * 3.0;
  auto t = torch::randint(0, vocab, {1, rows}, torch::kLong);
  auto x32 = x.to(torch::kFloat).requires_grad_(true);
  auto loss = lm_loss_sum(x32, t);
  loss.backward();
  auto logp = x - torch::logsumexp(x, -1, /*keepdim=*/true);
  auto real = t.ne(kPadId);
  const double want = -(logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>();
  EXPECT_NEAR(loss.item<double>(), want, 1e-6 * std::abs(want));
  auto grad = logp.exp() - torch::one_hot(t, vocab).to(torch::kDouble);
  grad = grad * real.unsqueeze(-1);
  // float32 bound: x - logsumexp(x) is rounded at |x| up to ~15 (an ulp of ~1e-6), which scales
  // each probability p by up to 1 + 2e-6: a row whose largest p is near 1 is off by ~1.5e-6 there
  // (an unseeded run drew such a row). 4e-6 holds that; a wrong gradient is off by far more.
  EXPECT_LE((x32.grad().to(torch::kDouble) - grad).abs().max().item<double>(), 4e-6);
  auto bad = t.clone();
  bad[0][7] = vocab;
  EXPECT_THROW(lm_loss_sum(x32.detach(), bad), Error);
}

TEST(LossTest, BFloat16LogitsInFloat32AndAGradientRoundedOnce) {
  // bf16 logits (bf16 autocast's head output) over several CPU chunks with a ragged last one:
  // the loss of those very bf16 values against float64 log-softmax by the formula, and the
  // gradient (bf16, upstream 2) against the float64 one: rounded once, so within half a bf16
  // unit in the last place (at most 2^-8 relative: 8 significant bits). Pad rows get exactly 0.
  const int64_t rows = 301, vocab = 3000;
  torch::manual_seed(4);
  auto xb = (torch::randn({1, rows, vocab}) * 3.0).to(torch::kBFloat16);
  auto t = torch::randint(0, vocab, {1, rows}, torch::kLong);
  t[0].narrow(0, 100, 7).fill_(kPadId);
  auto x = xb.detach().requires_grad_(true);
  auto loss = lm_loss_sum(x, t);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  (loss * 2.0).backward();
  auto xd = xb.to(torch::kDouble);
  auto logp = xd - torch::logsumexp(xd, -1, /*keepdim=*/true);
  auto real = t.ne(kPadId);
  const double want = -(logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>();
  EXPECT_NEAR(loss.item<double>(), want, 1e-6 * std::abs(want));
  {
    torch::NoGradGuard no_grad;  // the no-grad path keeps nothing and gives the same value
    EXPECT_NEAR(lm_loss_sum(xb, t).item<double>(), want, 1e-6 * std::abs(want));
  }
  ASSERT_EQ(x.grad().scalar_type(), torch::kBFloat16);
  auto grad = (logp.exp() - torch::one_hot(t, vocab).to(torch::kDouble)) * real.unsqueeze(-1) * 2.0;
  auto err = (x.grad().to(torch::kDouble) - grad).abs();
  // (+ 1e-6 x the upstream gradient: float32's error in exp(x - lse) before the rounding, which
  // matters where softmax - 1 cancels at a target with probability near 1.)
  EXPECT_TRUE((err <= grad.abs() * std::ldexp(1.0, -8) + 2e-6).all().item<bool>())
      << (err - grad.abs() * std::ldexp(1.0, -8)).max().item<double>();
  EXPECT_EQ(x.grad()[0].narrow(0, 100, 7).abs().sum().item<double>(), 0.0);
}

// A vocabulary narrower than one 16-lane vector (the bf16 row kernels' scalar tails only):
// value and gradient against float64 by the formula, as above.
TEST(LossTest, BFloat16LogitsNarrowVocabulary) {
  torch::manual_seed(6);
  auto xb = (torch::randn({2, 3, 5}) * 2.0).to(torch::kBFloat16);
  auto t = torch::tensor({4, 1, 0, 2, 3, 4}, torch::kLong).view({2, 3});  // one pad target
  auto x = xb.detach().requires_grad_(true);
  auto loss = lm_loss_sum(x, t);
  loss.backward();
  auto xd = xb.to(torch::kDouble);
  auto logp = xd - torch::logsumexp(xd, -1, /*keepdim=*/true);
  auto real = t.ne(kPadId);
  const double want = -(logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>();
  EXPECT_NEAR(loss.item<double>(), want, 1e-6 * std::abs(want));
  auto grad = (logp.exp() - torch::one_hot(t, 5).to(torch::kDouble)) * real.unsqueeze(-1);
  auto err = (x.grad().to(torch::kDouble) - grad).abs();
  EXPECT_TRUE((err <= grad.abs() * std::ldexp(1.0, -8) + 1e-6).all().item<bool>());
  EXPECT_EQ(x.grad()[0][2].abs().sum().item<double>(), 0.0);  // the pad row
}

// Float32 logits on the CPU (the row kernels of loss.cpp) with a vocabulary narrower than one
// 16-lane vector (scalar tails only), one of 16 + 3 (a vector and a tail) and one of 32 (vectors
// only), pad rows and an upstream gradient of 3: value and gradient against float64 by the
// formula; pad rows get exactly 0.
TEST(LossTest, Float32NarrowVocabulariesAndPadRows) {
  for (int64_t vocab : {5, 19, 32}) {
    SCOPED_TRACE(vocab);
    torch::manual_seed(7);
    auto xd = torch::randn({2, 3, vocab}, torch::kDouble) * 4.0;
    auto t = torch::tensor({4, 1, 0, 2, 3, 0}, torch::kLong).view({2, 3});  // two pad targets
    auto x = xd.to(torch::kFloat).requires_grad_(true);
    auto loss = lm_loss_sum(x, t);
    (loss * 3.0).backward();
    auto xr = xd.to(torch::kFloat).to(torch::kDouble);  // the float32 values the loss saw
    auto logp = xr - torch::logsumexp(xr, -1, /*keepdim=*/true);
    auto real = t.ne(kPadId);
    const double want =
        -(logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>();
    EXPECT_NEAR(loss.item<double>(), want, 1e-6 * std::abs(want));
    {
      torch::NoGradGuard no_grad;
      EXPECT_NEAR(lm_loss_sum(x.detach(), t).item<double>(), want, 1e-6 * std::abs(want));
    }
    auto grad =
        (logp.exp() - torch::one_hot(t, vocab).to(torch::kDouble)) * real.unsqueeze(-1) * 3.0;
    EXPECT_LE((x.grad().to(torch::kDouble) - grad).abs().max().item<double>(), 3e-6);
    EXPECT_EQ(x.grad()[0][2].abs().sum().item<double>(), 0.0);
    EXPECT_EQ(x.grad()[1][2].abs().sum().item<double>(), 0.0);
  }
}

// The fused head against float64: loss, dx, dweight, dbias of loss * 3, for a vocabulary of
// 2^14 (on one thread chunks of 64 rows: 150 rows give two whole chunks and a partial one) and
// for narrow vocabularies (one chunk, fewer than 16 lanes, a tail), with pad targets, with and
// without a bias.
TEST(LossTest, FusedHeadAgainstFloat64) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);  // (more threads take chunks of 256 rows at this vocabulary)
  struct RestoreThreads {
    int n;
    ~RestoreThreads() { at::set_num_threads(n); }
  } restore{threads};
  struct Case {
    int64_t batch, seq, d, vocab;
    bool bias;
  };
  for (const Case& c : {Case{2, 75, 8, 16384, true}, Case{3, 50, 8, 16384, false},
                        Case{2, 3, 4, 5, true}, Case{1, 7, 6, 19, false}}) {
    SCOPED_TRACE(testing::Message() << c.batch << "x" << c.seq << " d " << c.d << " vocab "
                                    << c.vocab << " bias " << c.bias);
    torch::manual_seed(11);
    const auto xd = torch::randn({c.batch, c.seq, c.d}, torch::kDouble);
    const auto wd = torch::randn({c.vocab, c.d}, torch::kDouble);
    const auto bd = c.bias ? torch::randn({c.vocab}, torch::kDouble)
                           : torch::zeros({c.vocab}, torch::kDouble);
    auto t = torch::randint(1, c.vocab, {c.batch, c.seq}, torch::kLong);
    t[0][1] = kPadId;
    t[c.batch - 1][c.seq - 1] = kPadId;
    auto x = xd.to(torch::kFloat).requires_grad_(true);
    auto w = wd.to(torch::kFloat).requires_grad_(true);
    auto b = c.bias ? bd.to(torch::kFloat).requires_grad_(true) : torch::Tensor();
    auto loss = lm_head_loss_sum(x, w, b, t);
    (loss * 3.0).backward();

    // float64 over the float32 inputs' values.
    const auto xr = xd.to(torch::kFloat).to(torch::kDouble).view({-1, c.d});
    const auto wr = wd.to(torch::kFloat).to(torch::kDouble);
    const auto br = bd.to(torch::kFloat).to(torch::kDouble);
    const auto logits = xr.matmul(wr.t()) + br;
    const auto logp = logits - torch::logsumexp(logits, -1, /*keepdim=*/true);
    const auto tf = t.view({-1});
    const auto real = tf.ne(kPadId).to(torch::kDouble);
    const double want =
        -(logp.gather(-1, tf.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>();
    EXPECT_NEAR(loss.item<double>(), want, 2e-6 * std::abs(want));
    const auto g = (logp.exp() - torch::one_hot(tf, c.vocab).to(torch::kDouble)) *
                   real.unsqueeze(-1) * 3.0;
    const auto want_dx = g.matmul(wr).view({c.batch, c.seq, c.d});
    const auto want_dw = g.t().matmul(xr);
    auto rel = [](const torch::Tensor& got, const torch::Tensor& ref) {
      return (got.to(torch::kDouble) - ref).abs().max().item<double>() /
             ref.abs().max().item<double>();
    };
    EXPECT_LE(rel(x.grad(), want_dx), 1e-5);
    EXPECT_LE(rel(w.grad(), want_dw), 1e-5);
    if (c.bias) EXPECT_LE(rel(b.grad(), g.sum(0)), 1e-5);
    // Pad targets give exactly zero input gradients.
    EXPECT_EQ(x.grad()[0][1].abs().sum().item<double>(), 0.0);
    EXPECT_EQ(x.grad()[c.batch - 1][c.seq - 1].abs().sum().item<double>(), 0.0);
    {
      torch::NoGradGuard no_grad;
      EXPECT_NEAR(lm_head_loss_sum(x, w, b, t).item<double>(), want, 2e-6 * std::abs(want));
    }
  }
}

// The fused head's loss and gradients in float64 over the float32 values of x [batch, seq, d],
// w [vocab, d] and b [vocab] (or undefined), for an upstream gradient `upstream`.
struct HeadReference {
  double loss;
  torch::Tensor dx, dw, db;  // [batch, seq, d], [vocab, d], [vocab] float64
};
HeadReference head_reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             const torch::Tensor& t, double upstream) {
  const int64_t d = x.size(-1), vocab = w.size(0);
  const auto xr = x.detach().to(torch::kDouble).reshape({-1, d});
  const auto wr = w.detach().to(torch::kDouble);
  auto logits = xr.matmul(wr.t());
  if (b.defined()) logits = logits + b.detach().to(torch::kDouble);
  const auto logp = logits - torch::logsumexp(logits, -1, /*keepdim=*/true);
  const auto tf = t.reshape({-1});
  const auto real = tf.ne(kPadId).to(torch::kDouble);
  const auto g = (logp.exp() - torch::one_hot(tf, vocab).to(torch::kDouble)) *
                 real.unsqueeze(-1) * upstream;
  return {-(logp.gather(-1, tf.unsqueeze(-1)).squeeze(-1) * real).sum().item<double>(),
          g.matmul(wr).view(x.sizes()), g.t().matmul(xr), g.sum(0)};
}

// Largest |got - want| over the largest |want|.
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want).abs().max().item<double>() /
         want.abs().max().item<double>();
}

// With retain_graph the backward pass may run twice (the gradients add up); a second backward
// without it is refused, as for any autograd node.
TEST(LossTest, FusedHeadBackwardTwice) {
  torch::manual_seed(12);
  auto x = torch::randn({2, 5, 6}).requires_grad_(true);
  auto w = torch::randn({9, 6}).requires_grad_(true);
  auto b = torch::randn({9}).requires_grad_(true);
  auto t = torch::randint(1, 9, {2, 5}, torch::kLong);
  auto loss = lm_head_loss_sum(x, w, b, t);
  loss.backward({}, /*retain_graph=*/true);
  const auto dx = x.grad().clone(), dw = w.grad().clone(), db = b.grad().clone();
  loss.backward();
  EXPECT_TRUE(x.grad().equal(dx * 2));
  EXPECT_TRUE(w.grad().equal(dw * 2));
  EXPECT_TRUE(b.grad().equal(db * 2));
  EXPECT_ANY_THROW(loss.backward());
}

// Only what requires grad gets a gradient, and the right one: the bias alone (the third tensor
// argument, after x and the weight), the weight alone, x alone. Non-contiguous x and weight
// (transposed views; the weight's gradient reaches its base), and an empty batch.
TEST(LossTest, FusedHeadPartialGradientsStridedAndEmpty) {
  torch::manual_seed(14);
  const auto x0 = torch::randn({2, 5, 6}), w0 = torch::randn({9, 6}), b0 = torch::randn({9});
  auto t = torch::randint(1, 9, {2, 5}, torch::kLong);
  t[1][2] = kPadId;
  const HeadReference ref = head_reference(x0, w0, b0, t, 1.0);
  for (int wanted = 0; wanted < 3; ++wanted) {
    SCOPED_TRACE(wanted);
    auto x = x0.clone().requires_grad_(wanted == 0);
    auto w = w0.clone().requires_grad_(wanted == 1);
    auto b = b0.clone().requires_grad_(wanted == 2);
    auto loss = lm_head_loss_sum(x, w, b, t);
    EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-6 * std::abs(ref.loss));
    loss.backward();
    EXPECT_EQ(x.grad().defined(), wanted == 0);
    EXPECT_EQ(w.grad().defined(), wanted == 1);
    EXPECT_EQ(b.grad().defined(), wanted == 2);
    if (wanted == 0) EXPECT_LE(relative_error(x.grad(), ref.dx), 1e-5);
    if (wanted == 1) EXPECT_LE(relative_error(w.grad(), ref.dw), 1e-5);
    if (wanted == 2) EXPECT_LE(relative_error(b.grad(), ref.db), 1e-5);
  }
  {
    auto xbase = x0.transpose(0, 1).contiguous().requires_grad_(true);  // [5, 2, 6]
    auto wbase = w0.t().contiguous().requires_grad_(true);              // [6, 9]
    auto x = xbase.transpose(0, 1), w = wbase.t();  // [2, 5, 6] and [9, 6], not contiguous
    ASSERT_FALSE(x.is_contiguous() || w.is_contiguous());
    auto loss = lm_head_loss_sum(x, w, torch::Tensor(), t);
    const HeadReference r = head_reference(x0, w0, torch::Tensor(), t, 1.0);
    EXPECT_NEAR(loss.item<double>(), r.loss, 1e-6 * std::abs(r.loss));
    loss.backward();
    EXPECT_LE(relative_error(xbase.grad().transpose(0, 1), r.dx), 1e-5);
    EXPECT_LE(relative_error(wbase.grad().t(), r.dw), 1e-5);
  }
  {
    auto x = torch::randn({0, 5, 6}).requires_grad_(true);
    auto w = w0.clone().requires_grad_(true);
    auto b = b0.clone().requires_grad_(true);
    auto loss = lm_head_loss_sum(x, w, b, torch::zeros({0, 5}, torch::kLong));
    EXPECT_EQ(loss.item<double>(), 0.0);
    loss.backward();
    EXPECT_EQ(x.grad().sizes(), x.sizes());
    EXPECT_EQ(w.grad().abs().sum().item<double>(), 0.0);
    EXPECT_EQ(b.grad().abs().sum().item<double>(), 0.0);
  }
}

TEST(LossTest, FusedHeadErrors) {
  auto x = torch::randn({2, 3, 4});
  auto w = torch::randn({7, 4});
  auto t = torch::randint(0, 7, {2, 3}, torch::kLong);
  EXPECT_NO_THROW(lm_head_loss_sum(x, w, torch::Tensor(), t));
  EXPECT_THROW(lm_head_loss_sum(x, torch::randn({7, 5}), torch::Tensor(), t), Error);
  EXPECT_THROW(lm_head_loss_sum(x, w, torch::randn({6}), t), Error);
  EXPECT_THROW(lm_head_loss_sum(x, w, torch::Tensor(), t.view({6})), Error);
  EXPECT_THROW(lm_head_loss_sum(x, w, torch::Tensor(), t.to(torch::kInt)), Error);
  EXPECT_THROW(lm_head_loss_sum(x, w, torch::Tensor(), t + 7), Error);
  EXPECT_THROW(lm_head_loss_sum(x.to(torch::kBFloat16), w, torch::Tensor(), t), Error);
  EXPECT_FALSE(lm_head_loss_fusable(x.to(torch::kDouble), w));
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(lm_head_loss_fusable(x, w));
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  EXPECT_TRUE(lm_head_loss_fusable(x, w));
}

}  // namespace
}  // namespace mllm
