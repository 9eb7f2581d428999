// mllm::dropout_add_layer_norm and mllm::rms_norm (kernels/norm.h): the fused float32 CPU passes
// against the same computation in float64 (forward and every gradient), dropout's random draws
// against dropout_add's, thread-count independence, grad mode against no grad mode, and the
// LibTorch composition where a fused pass does not apply.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <vector>

#include "mllm/core/error.h"
#include "mllm/model/dropout.h"
#include "mllm/model/norm.h"

namespace mllm {
namespace {

constexpr double kEps = 1e-5;

struct Inputs {
  torch::Tensor res, branch, weight, bias, g;
};

Inputs make_inputs(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t d = shape.back();
  Inputs in;
  in.res = torch::randn(shape) * 2 + 0.5;  // a mean away from 0, as a residual stream has
  in.branch = torch::randn(shape) * 3;
  in.weight = 1 + 0.3 * torch::randn({d});
  in.bias = 0.2 * torch::randn({d});
  in.g = torch::randn(shape);
  return in;
}

struct Result {
  torch::Tensor y, dres, dbranch, dweight, dbias;
};

// The fused call in training with `p` after manual_seed(draw_seed), with its four gradients for
// upstream in.g.
Result run_fused(const Inputs& in, double p, bool training, uint64_t draw_seed) {
  auto r = in.res.clone().requires_grad_(true), b = in.branch.clone().requires_grad_(true);
  auto w = in.weight.clone().requires_grad_(true), bi = in.bias.clone().requires_grad_(true);
  torch::manual_seed(draw_seed);
  auto y = dropout_add_layer_norm(r, b, p, training, w, bi, kEps);
  y.backward(in.g);
  return {y.detach(), r.grad(), b.grad(), w.grad(), bi.grad()};
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// Forward and backward against float64: the keep mask and scale are read off mllm::dropout with
// the same seed (a dropped element is 0, a kept one branch * float(1 / (1 - p))), the sum s =
// residual + dropped is taken in float32 (the fused pass must give these bits), and LayerNorm and
// its gradients (LibTorch's autograd) run in float64 from there. Bounds: a few float32 roundings
// of the largest magnitude (the row sums of d = 128 values in 16 lanes: Higham's bound
// 8 * 2^-24 per lane sum, 16 lanes more, far below 2^-17).
TEST(DropoutAddLayerNorm, ForwardAndGradientsAgainstFloat64) {
  const Inputs in = make_inputs({4, 37, 128}, 1);
  for (const auto& [p, training] :
       {std::pair{0.1, true}, std::pair{0.5, true}, std::pair{0.0, true}, std::pair{0.3, false}}) {
    const Result f = run_fused(in, p, training, 77);
    torch::manual_seed(77);
    const torch::Tensor dropped = mllm::dropout(in.branch, p, training);
    const torch::Tensor keep_scale =
        (dropped != 0).to(torch::kDouble) * (training ? 1.0 / (1.0 - p) : 1.0);
    const torch::Tensor s32 = in.res + dropped;

    auto s = s32.to(torch::kDouble).requires_grad_(true);
    auto w = in.weight.to(torch::kDouble).requires_grad_(true);
    auto bi = in.bias.to(torch::kDouble).requires_grad_(true);
    auto y = torch::layer_norm(s, {128}, w, bi, kEps);
    y.backward(in.g.to(torch::kDouble));
    const torch::Tensor ds = s.grad();
    // The float32 keep * scale as dropout applied it: float(1 / (1 - p)).
    const torch::Tensor k32 = keep_scale.to(torch::kFloat).to(torch::kDouble);

    const auto check = [&](const char* what, const torch::Tensor& got, const torch::Tensor& want,
                           double rel) {
      ASSERT_EQ(got.scalar_type(), torch::kFloat) << what;
      ASSERT_EQ(got.sizes(), want.sizes()) << what;
      const double err = max_abs(got.to(torch::kDouble) - want);
      EXPECT_LE(err, rel * max_abs(want)) << what << " p " << p << " training " << training;
    };
    check("y", f.y, y.detach(), std::ldexp(1.0, -19));
    check("d residual", f.dres, ds, std::ldexp(1.0, -17));
    check("d branch", f.dbranch, ds * k32, std::ldexp(1.0, -17));
    check("d weight", f.dweight, w.grad(), std::ldexp(1.0, -17));
    check("d bias", f.dbias, bi.grad(), std::ldexp(1.0, -17));
    // Where the branch was dropped its gradient is exactly 0.
    EXPECT_TRUE(f.dbranch.masked_select(dropped == 0).eq(0).all().item<bool>());
  }
}

// The same values as LibTorch's float32 composition (layer_norm of residual + dropout(branch)),
// to float32 rounding, and the same number of draws from the default generator as dropout_add:
// one in training with p > 0, none in evaluation or with p == 0.
TEST(DropoutAddLayerNorm, AgreesWithTheLibTorchCompositionAndDrawsAsDropoutAdd) {
  const Inputs in = make_inputs({2, 64, 64}, 2);
  for (const auto& [p, training] :
       {std::pair{0.1, true}, std::pair{0.0, true}, std::pair{0.1, false}}) {
    torch::manual_seed(5);
    const auto y = dropout_add_layer_norm(in.res, in.branch, p, training, in.weight, in.bias,
                                          kEps);
    const auto next1 = torch::rand({4});
    torch::manual_seed(5);
    const auto want = torch::layer_norm(dropout_add(in.res, in.branch, p, training), {64},
                                        in.weight, in.bias, kEps);
    const auto next2 = torch::rand({4});
    EXPECT_TRUE(next1.equal(next2)) << "p " << p << " training " << training;
    EXPECT_LE(max_abs(y - want), 1e-5 * max_abs(want)) << "p " << p << " training " << training;
    // The sum is LibTorch's bit for bit (two roundings, no fused multiply-add): the pass over
    // LibTorch's sum with a zero branch in evaluation (s = sum + 0) gives the same bits.
    torch::manual_seed(5);
    const auto sum = dropout_add(in.res, in.branch, p, training);
    EXPECT_TRUE(y.equal(dropout_add_layer_norm(sum, torch::zeros_like(sum), 0.0, false, in.weight,
                                               in.bias, kEps)))
        << "p " << p << " training " << training;
  }
  // Under CPU autocast: LibTorch's composition, bit for bit.
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  torch::manual_seed(6);
  const auto y = dropout_add_layer_norm(in.res, in.branch, 0.1, true, in.weight, in.bias, kEps);
  torch::manual_seed(6);
  const auto want = torch::layer_norm(dropout_add(in.res, in.branch, 0.1, true), {64}, in.weight,
                                      in.bias, kEps);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_TRUE(y.equal(want));
}

// The gradients do not depend on the thread count (the weight and bias sums per fixed block of
// rows, added in order), and outside grad mode the forward gives the bits of grad mode's.
TEST(DropoutAddLayerNorm, SameBitsAtAnyThreadCountAndWithoutGradMode) {
  const Inputs in = make_inputs({3, 400, 48}, 3);  // 1,200 rows: the forward splits too
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const Result one = run_fused(in, 0.2, true, 9);
  torch::set_num_threads(std::max(2, threads));
  const Result many = run_fused(in, 0.2, true, 9);
  torch::set_num_threads(threads);
  EXPECT_TRUE(one.y.equal(many.y));
  EXPECT_TRUE(one.dres.equal(many.dres));
  EXPECT_TRUE(one.dbranch.equal(many.dbranch));
  EXPECT_TRUE(one.dweight.equal(many.dweight));
  EXPECT_TRUE(one.dbias.equal(many.dbias));
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  const auto y = dropout_add_layer_norm(in.res, in.branch, 0.2, true, in.weight, in.bias, kEps);
  EXPECT_TRUE(y.equal(one.y));
}

// Only the gradients asked for: a frozen norm (weight and bias without requires_grad) and a
// residual that needs none give the branch's gradient alone, with the same bits.
TEST(DropoutAddLayerNorm, GradientsOnlyForInputsThatNeedThem) {
  const Inputs in = make_inputs({5, 32}, 4);
  const Result all = run_fused(in, 0.3, true, 11);
  auto b = in.branch.clone().requires_grad_(true);
  torch::manual_seed(11);
  dropout_add_layer_norm(in.res, b, 0.3, true, in.weight, in.bias, kEps).backward(in.g);
  EXPECT_TRUE(b.grad().equal(all.dbranch));
}

// Where the fused pass does not apply, the LibTorch composition bit for bit: a last dimension
// that is not a multiple of 16, a bf16 branch (dropout_add's fused bf16 form), and the module
// overload with a norm without affine parameters.
TEST(DropoutAddLayerNorm, LibTorchCompositionWhereTheFusedPassDoesNotApply) {
  const Inputs in = make_inputs({6, 24}, 5);
  torch::manual_seed(6);
  auto y = dropout_add_layer_norm(in.res, in.branch, 0.2, true, in.weight, in.bias, kEps);
  torch::manual_seed(6);
  EXPECT_TRUE(y.equal(torch::layer_norm(in.res + mllm::dropout(in.branch, 0.2, true), {24},
                                        in.weight, in.bias, kEps)));

  const Inputs in32 = make_inputs({6, 32}, 6);
  const auto b16 = in32.branch.to(torch::kBFloat16);
  torch::manual_seed(7);
  y = dropout_add_layer_norm(in32.res, b16, 0.2, true, in32.weight, in32.bias, kEps);
  torch::manual_seed(7);
  EXPECT_TRUE(y.equal(torch::layer_norm(dropout_add(in32.res, b16, 0.2, true), {32}, in32.weight,
                                        in32.bias, kEps)));

  Dropout drop(0.2);
  torch::nn::LayerNorm plain(torch::nn::LayerNormOptions({32}).elementwise_affine(false));
  torch::manual_seed(8);
  y = dropout_add_layer_norm(in32.res, in32.branch, *drop, *plain);
  torch::manual_seed(8);
  EXPECT_TRUE(y.equal(plain(drop->add_to(in32.res, in32.branch))));

  // The module overload takes the modules' p, training flag, weight, bias and eps.
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({32}).eps(0.5));
  {
    torch::NoGradGuard no_grad;
    norm->weight.normal_(1.0, 0.3);
    norm->bias.normal_(0.0, 0.2);
  }
  torch::manual_seed(9);
  y = dropout_add_layer_norm(in32.res, in32.branch, *drop, *norm);
  torch::manual_seed(9);
  EXPECT_TRUE(y.equal(dropout_add_layer_norm(in32.res, in32.branch, 0.2, true, norm->weight,
                                             norm->bias, 0.5)));
  drop->eval();
  y = dropout_add_layer_norm(in32.res, in32.branch, *drop, *norm);
  EXPECT_LE(max_abs(y - norm(in32.res + in32.branch)), 1e-5 * max_abs(y));
  EXPECT_THROW(dropout_add_layer_norm(in32.res, in32.branch, 1.0, true, in32.weight, in32.bias,
                                      kEps),
               Error);
}

// RMSNorm against float64 (LibTorch's autograd of the composition): the output within 2^-19 and
// dx, d weight within 2^-17 of their largest magnitude (the mean of d = 64 squares in 16 lanes);
// d weight's row sums over 87 rows (3 blocks of 32, the last partial).
TEST(RmsNorm, ForwardAndGradientsAgainstFloat64) {
  torch::manual_seed(12);
  const auto x0 = torch::randn({3, 29, 64}) * 2 + 0.5;
  const auto w0 = 1 + 0.3 * torch::randn({64});
  const auto g = torch::randn({3, 29, 64});
  auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  auto y = rms_norm(x, w, kEps);
  y.backward(g);
  auto x64 = x0.to(torch::kDouble).requires_grad_(true);
  auto w64 = w0.to(torch::kDouble).requires_grad_(true);
  auto want = x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + kEps) * w64;
  want.backward(g.to(torch::kDouble));
  ASSERT_EQ(y.scalar_type(), torch::kFloat);
  EXPECT_LE(max_abs(y.detach().to(torch::kDouble) - want.detach()),
            std::ldexp(1.0, -19) * max_abs(want.detach()));
  EXPECT_LE(max_abs(x.grad().to(torch::kDouble) - x64.grad()),
            std::ldexp(1.0, -17) * max_abs(x64.grad()));
  EXPECT_LE(max_abs(w.grad().to(torch::kDouble) - w64.grad()),
            std::ldexp(1.0, -17) * max_abs(w64.grad()));
}

// The same bits at 1 and 2 threads, without grad mode, and under CPU bf16 autocast (a float32
// input stays float32 there); only the gradients asked for (a frozen weight).
TEST(RmsNorm, SameBitsAtAnyThreadCountWithoutGradModeAndUnderAutocast) {
  torch::manual_seed(13);
  const auto x0 = torch::randn({1200, 48}), w0 = 1 + 0.3 * torch::randn({48});
  const auto g = torch::randn({1200, 48});
  const auto run = [&](int threads) {
    const int before = torch::get_num_threads();
    torch::set_num_threads(threads);
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto y = rms_norm(x, w, kEps);
    y.backward(g);
    torch::set_num_threads(before);
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const auto one = run(1), many = run(std::max(2, torch::get_num_threads()));
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(one[i].equal(many[i])) << i;
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(rms_norm(x0, w0, kEps).equal(one[0]));
  }
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    const auto y = rms_norm(x0, w0, kEps);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    EXPECT_TRUE(y.equal(one[0]));
  }
  auto x = x0.clone().requires_grad_(true);
  rms_norm(x, w0, kEps).backward(g);
  EXPECT_TRUE(x.grad().equal(one[1]));
}

// Where the fused pass does not apply (a last dimension not a multiple of 16, a bf16 input) the
// composition bit for bit; a weight of the wrong length throws.
TEST(RmsNorm, CompositionWhereTheFusedPassDoesNotApplyAndBadShapes) {
  torch::manual_seed(14);
  const auto composition = [](const torch::Tensor& x, const torch::Tensor& w) {
    const auto xf = x.to(torch::kFloat);
    return (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + kEps)).to(x.scalar_type()) * w;
  };
  const auto x = torch::randn({5, 24}), w = torch::randn({24});
  EXPECT_TRUE(rms_norm(x, w, kEps).equal(composition(x, w)));
  const auto xb = torch::randn({5, 32}).to(torch::kBFloat16), wb = torch::randn({32});
  EXPECT_TRUE(rms_norm(xb, wb, kEps).equal(composition(xb, wb)));
  EXPECT_THROW(rms_norm(torch::randn({5, 32}), torch::randn({16}), kEps), Error);
}

}  // namespace
}  // namespace mllm
