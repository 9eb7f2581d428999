// Activation checkpointing (model/activation_checkpoint.h): gradients of a checkpointed function
// against the analytic ones, and of checkpointed models against the plain backward, bitwise, for
// both families (dropout on, fp32 and bf16 autocast), with the random generator left where the
// plain run leaves it.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>

#include "mllm/core/error.h"
#include "mllm/model/activation_checkpoint.h"
#include "mllm/model/loss.h"
#include "model_test_util.h"

namespace mllm {
namespace {

TEST(ActivationCheckpoint, GradientsOfAFunctionEqualTheAnalyticOnes) {
  auto w = torch::tensor({0.5, -2.0, 3.0}, torch::kDouble).requires_grad_(true);
  auto x = torch::tensor({0.1, 0.7, -1.2}, torch::kDouble).requires_grad_(true);
  int calls = 0;
  auto fn = [&calls, w](const torch::Tensor& in) {
    ++calls;
    return in.sin() * w;
  };
  auto y = checkpointed(fn, x * 2.0);
  EXPECT_EQ(calls, 1);
  y.sum().backward();
  EXPECT_EQ(calls, 2);  // recomputed in backward
  // d/dx sum(sin(2x) w) = 2 cos(2x) w; d/dw = sin(2x).
  const double xs[] = {0.1, 0.7, -1.2}, ws[] = {0.5, -2.0, 3.0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(x.grad()[i].item<double>(), 2 * std::cos(2 * xs[i]) * ws[i], 1e-15);
    EXPECT_NEAR(w.grad()[i].item<double>(), std::sin(2 * xs[i]), 1e-15);
  }
}

TEST(ActivationCheckpoint, KeepsNothingInsideAndRunsPlainlyWithoutGrad) {
  auto w = torch::ones({4}).requires_grad_(true);
  auto fn = [w](const torch::Tensor& in) { return (in * w).exp(); };
  auto x = torch::randn({4}).requires_grad_(true);
  auto y = checkpointed(fn, x);
  // The output's node is the checkpoint function, not exp's backward (nothing inside saved).
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name().find("ExpBackward"), std::string::npos) << y.grad_fn()->name();
  {
    torch::NoGradGuard no_grad;
    auto z = checkpointed(fn, x);
    EXPECT_FALSE(z.requires_grad());
    EXPECT_TRUE(z.equal(y.detach()));
  }
  auto plain = checkpointed(fn, x.detach());  // x without grad: run plainly, w's grad kept
  EXPECT_TRUE(plain.grad_fn());
  EXPECT_NE(plain.grad_fn()->name().find("ExpBackward"), std::string::npos);
}

TEST(ActivationCheckpoint, ModesChooseTheBlocks) {
  EXPECT_EQ(ActivationCheckpointing("none", 1).count(6), 0);
  EXPECT_EQ(ActivationCheckpointing("full", 1).count(6), 6);
  const ActivationCheckpointing every3("every_n", 3);
  EXPECT_EQ(every3.count(7), 3);  // blocks 0, 3, 6
  EXPECT_TRUE(every3.applies_to(0));
  EXPECT_FALSE(every3.applies_to(2));
  EXPECT_TRUE(every3.applies_to(6));
  EXPECT_THROW(ActivationCheckpointing("every_n", 0), ConfigError);
  EXPECT_THROW(ActivationCheckpointing("some", 1), ConfigError);
}

struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
  torch::Tensor rng_after;  // the default CPU generator's state after forward and backward
};

// One forward + backward of a tiny 3-layer model of `type` in training mode, dropout 0.1.
StepResult train_step(const std::string& type, const std::string& mode, bool bf16) {
  auto c = test::tiny_config(type, /*dropout=*/0.1);
  c.n_layers = 3;
  auto m = test::make_model(c, /*vocab=*/37, /*max_seq_len=*/8, /*seed=*/11);
  m->set_activation_checkpointing(ActivationCheckpointing(mode, 2));
  m->train();
  auto tokens = test::random_tokens(3, 8, 37, 5);
  auto targets = test::random_tokens(3, 8, 37, 6);
  torch::manual_seed(99);  // the dropout masks' seeds come from here
  StepResult r;
  {
    const bool prev = at::autocast::is_autocast_enabled(at::kCPU);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, bf16);
    r.loss = lm_loss_sum(m->forward(tokens), targets);
    at::autocast::set_autocast_enabled(at::kCPU, prev);
    at::autocast::clear_cache();
  }
  r.loss.backward();
  for (const auto& p : m->parameters()) r.grads.push_back(p.grad().clone());
  r.rng_after = at::detail::getDefaultCPUGenerator().get_state();
  return r;
}

void expect_bitwise_equal(const StepResult& plain, const StepResult& ckpt, const std::string& what) {
  EXPECT_TRUE(plain.loss.equal(ckpt.loss)) << what;
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_TRUE(plain.grads[i].equal(ckpt.grads[i]))
        << what << ": parameter " << i << " differs by "
        << test::max_abs_diff(plain.grads[i], ckpt.grads[i]);
  // The recomputation rewinds the generator and puts it back: the run continues alike.
  EXPECT_TRUE(plain.rng_after.equal(ckpt.rng_after)) << what;
}

TEST(ActivationCheckpoint, GradientsEqualThePlainBackwardBitwise) {
  for (const std::string type : {"minillm", "llama"}) {
    for (const bool bf16 : {false, true}) {
      const StepResult plain = train_step(type, "none", bf16);
      for (const std::string mode : {"full", "every_n"}) {
        const std::string what = type + " " + mode + (bf16 ? " bf16" : " fp32");
        expect_bitwise_equal(plain, train_step(type, mode, bf16), what);
      }
    }
  }
}

TEST(ActivationCheckpoint, DropoutIsOnAndDrawsFromTheGenerator) {
  // Were dropout off, the bitwise test above would not test the generator's rewinding.
  const StepResult a = train_step("minillm", "full", false);
  auto c = test::tiny_config("minillm", 0.1);
  c.n_layers = 3;
  auto m = test::make_model(c, 37, 8, 11);
  m->train();
  torch::manual_seed(99);
  auto x = m->forward(test::random_tokens(3, 8, 37, 5));
  torch::manual_seed(98);
  auto y = m->forward(test::random_tokens(3, 8, 37, 5));
  EXPECT_FALSE(x.equal(y));  // other masks
  EXPECT_TRUE(a.loss.isfinite().item<bool>());
}

TEST(ActivationCheckpoint, EvalModeAndCachedDecodingNeverCheckpoint) {
  auto m = test::make_model(test::tiny_config("llama", 0.1));
  m->set_activation_checkpointing(ActivationCheckpointing("full", 1));
  auto tokens = test::random_tokens(2, 6, 37, 3);
  auto logits = m->forward(tokens);  // eval mode (make_model)
  EXPECT_EQ(logits.grad_fn()->name().find("CheckpointFunction"), std::string::npos);
  KVCache cache;
  auto cached = m->forward_cached(tokens, cache);
  EXPECT_LT(test::max_abs_diff(logits, cached), 1e-5);
}

}  // namespace
}  // namespace mllm
