// Generation: greedy equals argmax whatever the seed, the KV-cached loop equals full forwards
// (also past max_seq_len, with the documented re-encode window), EOS / max_new_tokens / prompt
// cropping / streaming, seeded sampling, and the top-k / top-p kept sets on hand-made
// distributions.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "mllm/core/error.h"
#include "mllm/model/generate.h"
#include "model_test_util.h"

namespace mllm {
namespace {

using test::make_model;
using test::tiny_config;

constexpr int64_t kVocab = 37;
constexpr int64_t kWindow = 8;  // max_seq_len of the test models

// Greedy decoding by full forward passes, the context being the last `window` tokens as
// generate.h documents: the prompt cropped to max_seq_len; then, whenever the cache would
// exceed max_seq_len, a fresh window of the last max_seq_len - 1 tokens.
std::vector<int64_t> greedy_by_full_forward(LanguageModel& model, std::vector<int64_t> ids,
                                            int64_t n) {
  torch::NoGradGuard no_grad;
  size_t start = ids.size() > kWindow ? ids.size() - kWindow : 0;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> ctx(ids.begin() + static_cast<long>(start), ids.end());
    auto logits = model.forward(torch::tensor(ctx, torch::kLong).view({1, -1}));
    const int64_t next = logits[0][-1].argmax().item<int64_t>();
    out.push_back(next);
    ids.push_back(next);
    if (ids.size() - start > static_cast<size_t>(kWindow)) start = ids.size() - (kWindow - 1);
  }
  return out;
}

std::set<int64_t> kept(const torch::Tensor& filtered) {
  std::set<int64_t> s;
  auto f = filtered.contiguous();
  for (int64_t i = 0; i < f.size(-1); ++i)
    if (std::isfinite(f[i].item<double>())) s.insert(i);
  return s;
}

class GenerateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateTest, GreedyIsArgmaxWhateverTheSeed) {
  auto model = make_model(tiny_config(GetParam()), kVocab, kWindow);
  const std::vector<int64_t> prompt = {1, 5, 9};
  GenerateOptions opt;
  opt.temperature = 0;
  opt.max_new_tokens = 5;  // 3 + 5 = 8 positions: no window shift yet
  opt.eos_id = -1;
  opt.seed = 1;
  const auto a = generate(*model, prompt, opt);
  opt.seed = 12345;
  const auto b = generate(*model, prompt, opt);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, greedy_by_full_forward(*model, prompt, 5));
}

TEST_P(GenerateTest, CachedLoopMatchesFullForwardPastMaxSeqLen) {
  auto model = make_model(tiny_config(GetParam()), kVocab, kWindow);
  GenerateOptions opt;
  opt.temperature = 0;
  opt.max_new_tokens = 20;
  opt.eos_id = -1;
  const std::vector<int64_t> prompt = {2, 4, 6, 8, 10};
  EXPECT_EQ(generate(*model, prompt, opt), greedy_by_full_forward(*model, prompt, 20));
  // A prompt longer than max_seq_len is cropped to its last max_seq_len tokens.
  const std::vector<int64_t> long_prompt = {7, 7, 3, 1, 2, 9, 11, 13, 15, 17, 19, 21};
  const std::vector<int64_t> tail(long_prompt.end() - kWindow, long_prompt.end());
  const auto from_long = generate(*model, long_prompt, opt);
  EXPECT_EQ(from_long, generate(*model, tail, opt));
  EXPECT_EQ(from_long, greedy_by_full_forward(*model, long_prompt, 20));
}

TEST_P(GenerateTest, StopsAtEosAndStreams) {
  auto model = make_model(tiny_config(GetParam()), kVocab, kWindow);
  GenerateOptions opt;
  opt.temperature = 0;
  opt.max_new_tokens = 6;
  opt.eos_id = -1;
  const std::vector<int64_t> prompt = {1, 2};
  const auto all = generate(*model, prompt, opt);
  ASSERT_EQ(all.size(), 6u);
  // EOS = the third greedy token: generation stops before it at its first occurrence.
  opt.eos_id = all[2];
  const size_t first = static_cast<size_t>(std::find(all.begin(), all.end(), all[2]) - all.begin());
  std::vector<int64_t> streamed;
  const auto cut = generate(*model, prompt, opt, [&](int64_t id) { streamed.push_back(id); });
  EXPECT_EQ(cut, std::vector<int64_t>(all.begin(), all.begin() + static_cast<long>(first)));
  EXPECT_EQ(streamed, cut);
  opt.eos_id = -1;
  opt.max_new_tokens = 0;
  EXPECT_TRUE(generate(*model, prompt, opt).empty());
}

TEST_P(GenerateTest, SamplingIsSeededAndFiltered) {
  auto model = make_model(tiny_config(GetParam()), kVocab, kWindow);
  model->train();
  GenerateOptions opt;
  opt.temperature = 1.0;
  opt.max_new_tokens = 24;
  opt.eos_id = -1;
  opt.seed = 3;
  const std::vector<int64_t> prompt = {1};
  const auto a = generate(*model, prompt, opt);
  EXPECT_TRUE(model->is_training());  // mode restored
  EXPECT_EQ(a, generate(*model, prompt, opt));
  opt.seed = 4;
  EXPECT_NE(a, generate(*model, prompt, opt));
  for (int64_t id : a) EXPECT_TRUE(id >= 0 && id < kVocab);

  // top_k = 1 and a tiny top_p both leave only the argmax: sampling becomes greedy.
  GenerateOptions greedy = opt;
  greedy.temperature = 0;
  const auto expect = generate(*model, prompt, greedy);
  opt.top_k = 1;
  EXPECT_EQ(generate(*model, prompt, opt), expect);
  opt.top_k = 0;
  opt.top_p = 1e-6;
  opt.seed = 99;
  EXPECT_EQ(generate(*model, prompt, opt), expect);
}

TEST_P(GenerateTest, RejectsBadInput) {
  auto model = make_model(tiny_config(GetParam()), kVocab, kWindow);
  GenerateOptions opt;
  EXPECT_THROW(generate(*model, {}, opt), DataError);
  EXPECT_THROW(generate(*model, {1, kVocab}, opt), DataError);
  EXPECT_THROW(generate(*model, {1, -1}, opt), DataError);
  opt.temperature = -1;
  EXPECT_THROW(generate(*model, {1}, opt), ConfigError);
  opt.temperature = 1;
  opt.top_p = 0;
  EXPECT_THROW(generate(*model, {1}, opt), ConfigError);
}

INSTANTIATE_TEST_SUITE_P(Families, GenerateTest, ::testing::Values("minillm", "llama"));

// probabilities by index: 0.10, 0.50, 0.05, 0.20, 0.15 -> sorted 1, 3, 4, 0, 2.
torch::Tensor hand_logits() { return torch::log(torch::tensor({0.10f, 0.50f, 0.05f, 0.20f, 0.15f})); }

TEST(FilterLogitsTest, TopKKeepsTheKMostLikely) {
  auto l = hand_logits();
  EXPECT_EQ(kept(filter_logits(l, 1, 1.0)), (std::set<int64_t>{1}));
  EXPECT_EQ(kept(filter_logits(l, 2, 1.0)), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(filter_logits(l, 3, 1.0)), (std::set<int64_t>{1, 3, 4}));
  EXPECT_EQ(kept(filter_logits(l, 0, 1.0)).size(), 5u);
  EXPECT_EQ(kept(filter_logits(l, 9, 1.0)).size(), 5u);
  // Kept logits are unchanged, removed ones are -inf.
  auto f = filter_logits(l, 2, 1.0);
  EXPECT_EQ(f[1].item<float>(), l[1].item<float>());
  EXPECT_TRUE(std::isinf(f[0].item<float>()) && f[0].item<float>() < 0);
  // Ties with the k-th logit are all kept.
  auto ties = torch::tensor({1.0f, 2.0f, 2.0f, 0.0f});
  EXPECT_EQ(kept(filter_logits(ties, 1, 1.0)), (std::set<int64_t>{1, 2}));
  EXPECT_EQ(kept(filter_logits(ties, 3, 1.0)), (std::set<int64_t>{0, 1, 2}));
}

TEST(FilterLogitsTest, TopPKeepsTheSmallestSetReachingP) {
  auto l = hand_logits();
  // Mass before each sorted token: 1: 0, 3: 0.5, 4: 0.7, 0: 0.85, 2: 0.95.
  EXPECT_EQ(kept(filter_logits(l, 0, 0.45)), (std::set<int64_t>{1}));
  EXPECT_EQ(kept(filter_logits(l, 0, 0.6)), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(filter_logits(l, 0, 0.75)), (std::set<int64_t>{1, 3, 4}));
  EXPECT_EQ(kept(filter_logits(l, 0, 0.9)), (std::set<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(kept(filter_logits(l, 0, 0.99)).size(), 5u);
  EXPECT_EQ(kept(filter_logits(l, 0, 1e-9)), (std::set<int64_t>{1}));
  // Top-k first, then top-p over the renormalised survivors: {0.5, 0.2, 0.15} / 0.85 has mass
  // 0.588 before token 3 and 0.824 before token 4, so p = 0.8 keeps {1, 3} (without top-k: 0.7
  // before token 4, kept).
  EXPECT_EQ(kept(filter_logits(l, 3, 0.8)), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(filter_logits(l, 0, 0.8)), (std::set<int64_t>{1, 3, 4}));
  // Works row-wise on [rows, vocab].
  auto rows = torch::stack({l, l.flip(0)});
  auto f = filter_logits(rows, 0, 0.6);
  EXPECT_EQ(kept(f[0]), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(f[1]), (std::set<int64_t>{3, 1}));  // flipped: 0.15,0.2,0.05,0.5,0.1
  EXPECT_THROW(filter_logits(l, -1, 1.0), ConfigError);
  EXPECT_THROW(filter_logits(l, 0, 0.0), ConfigError);
}

}  // namespace
}  // namespace mllm
