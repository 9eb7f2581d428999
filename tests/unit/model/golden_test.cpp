// Parity with independent PyTorch models: logits and loss of fixed weights on a fixed batch
// (full, right-padded, left-padded and all-pad rows) equal tests/assets/model/golden_*.pt,
// written by tests/assets/model/make_golden.py (minillm = the peer's ddp_ref.py MiniLLM).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "mllm/model/loss.h"
#include "model_test_util.h"

namespace mllm {
namespace {

std::string asset(const std::string& name) {
  return std::string(MLLM_SOURCE_DIR) + "/tests/assets/model/" + name;
}

std::map<std::string, torch::Tensor> load_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto dict = torch::pickle_load(bytes).toGenericDict();
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : dict) out[e.key().toStringRef()] = e.value().toTensor();
  return out;
}

ModelConfig config_from_json(const nlohmann::json& j) {
  ModelConfig c;
  c.type = j.at("type").get<std::string>();
  c.d_model = j.at("d_model");
  c.n_heads = j.at("n_heads");
  c.n_kv_heads = j.value("n_kv_heads", 0);
  c.n_layers = j.at("n_layers");
  c.d_ff = j.at("d_ff");
  c.multiple_of = j.value("multiple_of", 32);
  c.rope_theta = j.value("rope_theta", 10000.0);
  c.norm_eps = j.at("norm_eps");
  c.tie_embeddings = j.value("tie_embeddings", false);
  c.dropout = j.at("dropout");
  return c;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsAndLossMatchPyTorch) {
  const std::string name = GetParam();
  std::ifstream jf(asset("golden_" + name + ".json"));
  ASSERT_TRUE(jf.good());
  const auto j = nlohmann::json::parse(jf);
  auto golden = load_tensors(asset("golden_" + name + ".pt"));

  auto model = test::make_model(config_from_json(j), j.at("vocab_size"), j.at("max_seq_len"));
  // Every parameter maps 1:1 to the PyTorch state_dict.
  int64_t golden_params = 0;
  for (const auto& kv : golden) golden_params += kv.first.rfind("param.", 0) == 0 ? 1 : 0;
  const auto named = model->named_parameters();
  ASSERT_EQ(static_cast<int64_t>(named.size()), golden_params);
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : named) {
      auto it = golden.find("param." + p.key());
      ASSERT_NE(it, golden.end()) << "no PyTorch parameter named " << p.key();
      ASSERT_EQ(p.value().sizes(), it->second.sizes()) << p.key();
      p.value().copy_(it->second);
    }
  }

  const auto& tokens = golden.at("tokens");
  const auto& targets = golden.at("targets");
  auto logits = model->forward(tokens);
  ASSERT_EQ(logits.scalar_type(), torch::kFloat);
  ASSERT_EQ(logits.sizes(), golden.at("logits").sizes());
  EXPECT_LE(test::max_abs_diff(logits, golden.at("logits")), 1e-5);

  auto loss_sum = lm_loss_sum(logits, targets);
  EXPECT_NEAR(loss_sum.item<double>(), golden.at("loss_sum").item<double>(), 1e-5);
  const double loss_mean = loss_sum.item<double>() / static_cast<double>(count_targets(targets));
  EXPECT_NEAR(loss_mean, golden.at("loss_mean").item<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenTest,
                         ::testing::Values("minillm", "llama", "llama_tied"));

}  // namespace
}  // namespace mllm
