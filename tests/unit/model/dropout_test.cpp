// mllm::dropout (kernels/dropout.h): keep rate, scaling, backward with the same mask, thread-count
// independence, reproducibility from the default generator.
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/model/dropout.h"

namespace mllm {
namespace {

TEST(Dropout, KeepRateAndScale) {
  torch::manual_seed(3);
  const double p = 0.1;
  auto x = torch::full({1 << 20}, 2.0f);
  auto y = mllm::dropout(x, p, /*training=*/true);
  const double kept = (y != 0).sum().item<double>() / x.numel();
  // Binomial(2^20, 0.9): standard deviation 2.9e-4; 6 of them.
  EXPECT_NEAR(kept, 0.9, 0.0018);
  // Every kept element is x / (1 - p) in float32: 2 * float(1 / 0.9).
  const float want = 2.0f * static_cast<float>(1.0 / 0.9);
  EXPECT_TRUE(((y == 0) | (y == want)).all().item<bool>());
}

TEST(Dropout, IdentityWhenEvaluatingOrPZero) {
  auto x = torch::randn({4, 5});
  EXPECT_TRUE(mllm::dropout(x, 0.3, /*training=*/false).equal(x));
  EXPECT_TRUE(mllm::dropout(x, 0.0, /*training=*/true).equal(x));
  EXPECT_THROW(mllm::dropout(x, 1.0, true), Error);
  EXPECT_THROW(mllm::dropout(x, -0.1, true), Error);
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  torch::manual_seed(5);
  // Non-contiguous input (a transpose) and a non-contiguous upstream gradient.
  auto base = torch::rand({64, 33}) + 0.5;
  auto x = base.t().clone().t().requires_grad_(true);  // [64, 33] with transposed strides
  auto y = mllm::dropout(x, 0.25, true);
  auto w = torch::rand({33, 64}).t();
  (y * w).sum().backward();
  // dy/dx = keep / (1 - p): where y kept x * (4/3), the gradient is w * (4/3); elsewhere 0.
  auto keep = (y != 0);
  auto want = torch::where(keep, w * static_cast<float>(1.0 / 0.75), torch::zeros_like(w));
  EXPECT_TRUE(torch::allclose(x.grad(), want, 0, 0)) << (x.grad() - want).abs().max();
  EXPECT_TRUE(torch::allclose(y.detach(), torch::where(keep, x.detach() * static_cast<float>(1.0 / 0.75),
                                                       torch::zeros_like(w)), 0, 0));
}

TEST(Dropout, SameMaskAtAnyThreadCountAndReproducibleFromTheSeed) {
  const int threads = torch::get_num_threads();
  auto x = torch::ones({3, 100000});
  torch::set_num_threads(1);
  torch::manual_seed(11);
  auto a = mllm::dropout(x, 0.5, true);
  auto a2 = mllm::dropout(x, 0.5, true);  // the generator moved on: another mask
  torch::set_num_threads(std::max(2, threads));
  torch::manual_seed(11);
  auto b = mllm::dropout(x, 0.5, true);
  torch::set_num_threads(threads);
  EXPECT_TRUE(a.equal(b));
  EXPECT_FALSE(a.equal(a2));
}

TEST(Dropout, BFloat16KeepsDtype) {
  torch::manual_seed(2);
  auto x = torch::full({1000}, 1.5, torch::kBFloat16);
  auto y = mllm::dropout(x, 0.5, true);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  // 1.5 * 2 = 3 is exact in bfloat16.
  EXPECT_TRUE(((y == 0) | (y == 3.0)).all().item<bool>());
}

TEST(Dropout, BFloat16KeepsTheFloat32MaskAndRoundsOnce) {
  // Odd length (a lone last element after the pairs) and values of both signs. The same seed
  // gives the same mask in either dtype; a kept bf16 element is float(x) / (1 - p) rounded to
  // bf16 by LibTorch's own conversion, a dropped one exactly 0.
  const double p = 0.3;
  const int64_t n = 100001;
  torch::manual_seed(9);
  auto x = ((torch::rand({n}) + 0.25) * (torch::randint(0, 2, {n}) * 2 - 1)).to(torch::kBFloat16);
  torch::manual_seed(21);
  auto y = mllm::dropout(x, p, true);
  torch::manual_seed(21);
  auto y32 = mllm::dropout(x.to(torch::kFloat), p, true);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  auto keep = y32 != 0;
  auto want = torch::where(keep, (x.to(torch::kFloat) * static_cast<float>(1.0 / (1.0 - p))).to(torch::kBFloat16),
                           torch::zeros_like(x));
  EXPECT_TRUE(y.equal(want));
  EXPECT_TRUE((y != 0).equal(keep));
  const double kept = keep.sum().item<double>() / n;
  EXPECT_NEAR(kept, 0.7, 0.01);  // Binomial(1e5, 0.7): standard deviation 1.4e-3
  // The backward pass applies the same mask to a bf16 gradient.
  auto xg = x.detach().requires_grad_(true);
  torch::manual_seed(21);
  auto yg = mllm::dropout(xg, p, true);
  auto g = torch::full({n}, 0.5, torch::kBFloat16);
  yg.backward(g);
  auto want_g = torch::where(keep, (g.to(torch::kFloat) * static_cast<float>(1.0 / (1.0 - p))).to(torch::kBFloat16),
                             torch::zeros_like(g));
  EXPECT_TRUE(xg.grad().equal(want_g));
}

// dropout_add: a float32 residual plus a bf16 branch in one pass equals residual +
// dropout(branch) — the bf16 dropout's values (a kept element float(x) / (1 - p) rounded to bf16)
// added in float32 — with the same seed, bit for bit, forward and backward (the branch's
// gradient: the float32 gradient rounded to bf16, then masked and scaled as dropout's backward).
// Odd length, both signs, training with p = 0.3, p = 0 and evaluation (no seed drawn: the next
// dropout's mask is unchanged), and the unfused fallback for a float32 branch.
TEST(Dropout, AddToResidualEqualsResidualPlusDropout) {
  const int64_t n = 100001;
  torch::manual_seed(4);
  auto res = torch::randn({n});
  auto branch = (torch::randn({n}) * 3).to(torch::kBFloat16);
  auto g = torch::randn({n});
  for (const auto& [p, training] : {std::pair{0.3, true}, std::pair{0.0, true}, std::pair{0.3, false}}) {
    auto r1 = res.clone().requires_grad_(true), b1 = branch.clone().requires_grad_(true);
    auto r2 = res.clone().requires_grad_(true), b2 = branch.clone().requires_grad_(true);
    torch::manual_seed(21);
    auto fused = dropout_add(r1, b1, p, training);
    auto next1 = torch::rand({4});
    torch::manual_seed(21);
    auto want = r2 + mllm::dropout(b2, p, training);
    auto next2 = torch::rand({4});
    ASSERT_EQ(fused.scalar_type(), torch::kFloat);
    EXPECT_TRUE(fused.equal(want)) << "p " << p << " training " << training;
    EXPECT_TRUE(next1.equal(next2));  // the same number of draws from the generator
    fused.backward(g);
    want.backward(g);
    EXPECT_TRUE(r1.grad().equal(r2.grad()));
    ASSERT_EQ(b1.grad().scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(b1.grad().equal(b2.grad())) << "p " << p << " training " << training;
  }
  // The formula, by hand: kept where the float32 dropout of the same seed keeps.
  torch::manual_seed(33);
  auto y = dropout_add(res, branch, 0.3, true);
  torch::manual_seed(33);
  auto keep = mllm::dropout(torch::ones({n}), 0.3, true) != 0;
  auto kept = (branch.to(torch::kFloat) * static_cast<float>(1.0 / 0.7)).to(torch::kBFloat16).to(torch::kFloat);
  EXPECT_TRUE(y.equal(res + torch::where(keep, kept, torch::zeros_like(kept))));
  // Not the fused case (a float32 branch): residual + dropout.
  torch::manual_seed(8);
  auto f = dropout_add(res, branch.to(torch::kFloat), 0.3, true);
  torch::manual_seed(8);
  EXPECT_TRUE(f.equal(res + mllm::dropout(branch.to(torch::kFloat), 0.3, true)));
  EXPECT_THROW(dropout_add(res, branch, 1.0, true), Error);
}

// softmax_dropout: forward bit for bit dropout(softmax(x)) with the same seed; the fused backward
// against float64: out = (gy - sum(gy * y)) * y with gy the dropout's backward of g (kept:
// bf16(g / (1 - p)), else 0), within one bf16 rounding of the result plus the float32 row sum's
// error bound (Higham: keys * 2^-24 * sum |gy * y|, times |y|). Rows of 256 keys with masked
// (-1e9) entries as in causal attention; evaluation, p = 0 and an odd last dimension take the
// unfused path (the same values).
TEST(Dropout, SoftmaxDropoutEqualsDropoutOfSoftmax) {
  const double p = 0.1;
  const int64_t rows = 600, keys = 256;  // several threads' chunks of 128 rows
  torch::manual_seed(12);
  auto x = (torch::randn({2, rows / 2, keys}) * 3)
               .masked_fill(torch::ones({rows / 2, keys}, torch::kBool).triu(1), -1e9)
               .to(torch::kBFloat16)
               .requires_grad_(true);
  auto g = torch::randn({2, rows / 2, keys}).to(torch::kBFloat16);
  torch::manual_seed(40);
  auto got = softmax_dropout(x, p, true);
  torch::manual_seed(40);
  auto want = mllm::dropout(torch::softmax(x.detach(), -1), p, true);
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(got.equal(want));
  got.backward(g);
  const auto y = torch::softmax(x.detach(), -1).to(torch::kDouble);
  torch::manual_seed(40);
  const auto keep_bits = mllm::dropout(torch::ones({2, rows / 2, keys}), p, true).ne(0);
  const auto gy = torch::where(keep_bits,
                               (g.to(torch::kFloat) * static_cast<float>(1.0 / (1.0 - p)))
                                   .to(torch::kBFloat16)
                                   .to(torch::kDouble),
                               torch::zeros({}, torch::kDouble));
  const auto dot = (gy * y).sum(-1, /*keepdim=*/true);
  const auto ref = (gy - dot) * y;
  const auto bound = ref.abs() * std::ldexp(1.0, -8) +
                     (gy * y).abs().sum(-1, true) * (keys * std::ldexp(1.0, -24)) * y.abs() + 1e-30;
  const auto err = (x.grad().to(torch::kDouble) - ref).abs();
  EXPECT_TRUE(err.le(bound).all().item<bool>()) << "max error " << err.max().item<double>();
  EXPECT_GT(x.grad().ne(0).sum().item<int64_t>(), rows * keys / 16);  // not vacuous
  // The unfused cases give dropout(softmax(x)) itself.
  auto xd = x.detach();
  EXPECT_TRUE(softmax_dropout(xd, p, false).equal(torch::softmax(xd, -1)));
  EXPECT_TRUE(softmax_dropout(xd, 0.0, true).equal(torch::softmax(xd, -1)));
  auto odd = xd.narrow(-1, 0, keys - 1).contiguous();
  torch::manual_seed(41);
  auto a = softmax_dropout(odd, p, true);
  torch::manual_seed(41);
  EXPECT_TRUE(a.equal(mllm::dropout(torch::softmax(odd, -1), p, true)));
  EXPECT_THROW(softmax_dropout(xd, 1.0, true), Error);
}

}  // namespace
}  // namespace mllm
