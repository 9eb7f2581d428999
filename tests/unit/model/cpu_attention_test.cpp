// mllm::cpu_attention (kernels/cpu/attention.h), bf16 and float32: values and gradients against
// float64 attention computed by the formula, its dropout mask against mllm::dropout's, and
// thread-count independence. Each test runs once per dtype where the kernel runs for it (bf16:
// mllm's bf16 products in use, kernels/cpu/bf16_linear.h: an AMX CPU, or MLLM_BF16_GEMM=mkl or
// sgemm as unit.model_bf16_sgemm sets it; float32: oneMKL's sgemm in libtorch_cpu.so); skipped
// elsewhere.
#include <gtest/gtest.h>

#include <cmath>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/attention.h"
#include "mllm/model/dropout.h"

namespace mllm {
namespace {

// Each test once for bf16 and once for float32 q/k/v.
class CpuAttention : public ::testing::TestWithParam<torch::ScalarType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, CpuAttention, ::testing::Values(torch::kBFloat16, torch::kFloat),
                         [](const auto& info) {
                           return std::string(info.param == torch::kFloat ? "Float32" : "BFloat16");
                         });

#define SKIP_WITHOUT_FUSED_ATTENTION()                                                     \
  if (!cpu_attention_available(GetParam()))                                                \
  GTEST_SKIP() << "cpu_attention has no product for " << GetParam()                        \
               << " here (bf16: mllm's bf16 products, kernels/cpu/bf16_linear.h; "         \
                  "float32: oneMKL's sgemm)"

struct Case {
  int64_t b, t, h, kvh, hd;
  bool padded;  // a per-batch mask with left padding (rows with every key masked), else causal
};

// [b or 1, 1, t, t] bool: causal, and with `padded` the first `pad` keys of batch i masked
// (pad = 3 i): query rows before the padding end see no key at all.
torch::Tensor make_mask(const Case& c) {
  auto causal = torch::ones({c.t, c.t}, torch::kBool).triu(1);
  if (!c.padded) return causal.view({1, 1, c.t, c.t});
  auto m = causal.unsqueeze(0).repeat({c.b, 1, 1});
  for (int64_t i = 0; i < c.b; ++i) m[i].narrow(1, 0, 3 * i).fill_(true);
  return m.unsqueeze(1);
}

// The float64 reference: q [b, t, h, hd], k, v [b, t, kvh, hd], mask as make_mask, keep
// [b, h, t, t] (1 kept / 0 dropped, already times 1 / (1 - p)) -> [b, t, h * hd]:
// softmax(masked_fill(q k^T * scale, -1e9)) * keep, times v (key/value head i / (h / kvh)).
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, const torch::Tensor& keep, double scale) {
  const int64_t b = q.size(0), t = q.size(1), h = q.size(2), hd = q.size(3), r = h / k.size(2);
  auto qh = q.transpose(1, 2);
  auto kh = k.transpose(1, 2).repeat_interleave(r, 1);
  auto vh = v.transpose(1, 2).repeat_interleave(r, 1);
  auto scores = torch::matmul(qh, kh.transpose(-2, -1)) * scale;
  auto p = torch::softmax(scores.masked_fill(mask, -1e9), -1) * keep;
  return torch::matmul(p, vh).transpose(1, 2).reshape({b, t, h * hd});
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

// The fused kernel on q/k/v split off one [b, t, (h + 2 kvh) hd] tensor (as mllm::linears
// gives them), with upstream gradient g.
Result fused(const Case& c, const torch::Tensor& qkv, const torch::Tensor& mask,
             const torch::Tensor& g, double p, uint64_t seed) {
  auto leaf = qkv.detach().requires_grad_(true);
  auto parts = leaf.split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);
  torch::manual_seed(seed);
  auto out = cpu_attention(parts[0].view({c.b, c.t, c.h, c.hd}),
                           parts[1].view({c.b, c.t, c.kvh, c.hd}),
                           parts[2].view({c.b, c.t, c.kvh, c.hd}), mask,
                           1.0 / std::sqrt(static_cast<double>(c.hd)), p, /*training=*/true);
  out.backward(g);
  auto grads = leaf.grad().split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// A stand-in for the unfused path the kernel replaced (attention.cpp before it): scores of
// qkv's dtype, scaled after the product (for bf16 attention.cpp scales q before it, or in the
// product for a power-of-two scale: the same bits at head_dim 16, one rounding apart at 8), the
// mask as a bias of 0 / -1e9 (for float32 the same values as masked_fill(-1e9)),
// mllm::softmax_dropout, a product.
Result unfused(const Case& c, const torch::Tensor& qkv, const torch::Tensor& mask,
               const torch::Tensor& g, double p, uint64_t seed) {
  auto leaf = qkv.detach().requires_grad_(true);
  auto parts = leaf.split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);
  const int64_t r = c.h / c.kvh;
  auto q = parts[0].view({c.b, c.t, c.h, c.hd}).transpose(1, 2);
  auto k = parts[1].view({c.b, c.t, c.kvh, c.hd}).transpose(1, 2).repeat_interleave(r, 1);
  auto v = parts[2].view({c.b, c.t, c.kvh, c.hd}).transpose(1, 2).repeat_interleave(r, 1);
  auto bias = torch::zeros(mask.sizes(), qkv.scalar_type()).masked_fill_(mask, -1e9);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  torch::manual_seed(seed);
  auto attn = softmax_dropout(scores + bias, p, /*training=*/true);
  auto out = torch::matmul(attn, v).transpose(1, 2).reshape({c.b, c.t, c.h * c.hd});
  out.backward(g);
  auto grads = leaf.grad().split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);
  return {out.detach(), grads[0], grads[1], grads[2]};
}

double mean_error(const torch::Tensor& x, const torch::Tensor& want) {
  return (x.to(torch::kDouble) - want).abs().mean().item<double>();
}

// |x - want| <= tol (elementwise), with the worst excess in the message.
::testing::AssertionResult within(const torch::Tensor& x, const torch::Tensor& want,
                                  const torch::Tensor& tol) {
  auto excess = (x.to(torch::kDouble) - want).abs() - tol;
  if ((excess <= 0).all().item<bool>()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "worst excess " << excess.max().item<double>();
}

// Output and gradients against float64 by the formula, with and without dropout (the float64
// reference uses mllm::dropout's mask drawn from the same seed), for multi-head and grouped
// key/value heads, shared causal and per-batch masks (with fully masked rows) over one and two
// row blocks (t > 128), and key counts that are not a multiple of 16. Bounds: bf16 keeps 8
// significant bits (unit roundoff u = 2^-8); the output is rounded once after a float32 product
// of probabilities each rounded once (twice with dropout), so |out - ref| <= u (P |v| + |ref|)
// (2u P |v| + u |ref|) up to float32 terms.
// The gradients pass through two bf16 roundings more (d scores, then the products); they are
// held to 2^-6 of each gradient's largest magnitude. float32 rounds nothing to a narrower type:
// its errors are float32 rounding (u = 2^-24) in the products over head_dim and keys terms, the
// exponential (2 units in the last place) and the row sums; the output is held to 2^-19 (P |v| +
// |ref|) (32u; 6u was the worst seen) and the gradients to 2^-18 of their largest magnitude
// (9u seen), and each on average to within 2x the unfused float32 path's error (the two round
// differently, neither always better).
TEST_P(CpuAttention, ValuesAndGradientsAgainstFloat64) {
  const torch::ScalarType dt = GetParam();
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Case cases[] = {{2, 50, 4, 4, 16, true},
                        {2, 34, 4, 2, 8, true},
                        {2, 50, 8, 2, 16, true},  // four query heads per key/value head
                        {1, 200, 2, 1, 8, false},
                        {2, 140, 2, 2, 8, true}};
  for (const Case& c : cases) {
    for (double p : {0.0, 0.2}) {
      SCOPED_TRACE(::testing::Message() << "t " << c.t << " heads " << c.h << "/" << c.kvh
                                        << " padded " << c.padded << " p " << p);
      torch::manual_seed(static_cast<uint64_t>(c.t));
      const auto qkv = torch::randn({c.b, c.t, (c.h + 2 * c.kvh) * c.hd}).to(dt);
      const auto g = torch::randn({c.b, c.t, c.h * c.hd}).to(dt);
      const auto mask = make_mask(c);
      const Result run = fused(c, qkv, mask, g, p, /*seed=*/17);
      // The same draw from the same seed: mllm::dropout's mask over [b, h, t, t].
      torch::manual_seed(17);
      const auto keep = mllm::dropout(torch::ones({c.b, c.h, c.t, c.t}, torch::kDouble), p, true);

      auto x = qkv.to(torch::kDouble).requires_grad_(true);
      auto parts = x.split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
      auto q = parts[0].view({c.b, c.t, c.h, c.hd}), k = parts[1].view({c.b, c.t, c.kvh, c.hd}),
           v = parts[2].view({c.b, c.t, c.kvh, c.hd});
      auto ref = reference(q, k, v, mask, keep, scale);
      ref.backward(g.to(torch::kDouble));
      auto grads = x.grad().split_with_sizes({c.h * c.hd, c.kvh * c.hd, c.kvh * c.hd}, -1);

      const bool bf16 = dt == torch::kBFloat16;
      const double u = std::ldexp(1.0, bf16 ? -8 : -19);
      torch::Tensor pv;  // P |v| with the reference's probabilities (dropout included)
      {
        torch::NoGradGuard no_grad;
        pv = reference(q, k, v.abs(), mask, keep, scale);
      }
      // (With dropout the kept probabilities are rounded twice: y, then y / (1 - p).)
      const double pu = p > 0.0 && bf16 ? 2 * u : u;
      const double floor = bf16 ? 1e-7 : 1e-12;
      EXPECT_TRUE(within(run.out, ref.detach(), (pv * pu + ref.detach().abs() * u) * 1.01 + floor));
      // And no less exact than the unfused path, on average, for every tensor (float32: within
      // 2x of it).
      const Result old = unfused(c, qkv, mask, g, p, 17);
      const double slack = bf16 ? 1.0 : 2.0;
      EXPECT_LE(mean_error(run.out, ref.detach()), slack * mean_error(old.out, ref.detach()));
      const torch::Tensor want[] = {grads[0], grads[1], grads[2]};
      const torch::Tensor got[] = {run.dq, run.dk, run.dv}, before[] = {old.dq, old.dk, old.dv};
      for (int i = 0; i < 3; ++i) {
        SCOPED_TRACE(i == 0 ? "dq" : i == 1 ? "dk" : "dv");
        const double largest = want[i].abs().max().item<double>();
        const auto tol = torch::full_like(want[i], largest * std::ldexp(1.0, bf16 ? -6 : -18));
        EXPECT_TRUE(within(got[i], want[i], tol));
        EXPECT_LE(mean_error(got[i], want[i]), slack * mean_error(before[i], want[i]));
      }
      // Masked scores get exactly zero gradient (as masked_fill's): with left padding, batch
      // 1's first 3 keys are masked for every query, so their dk rows are 0, and its first 3
      // queries see no key, so their dq rows are 0. (Their uniform weights still reach dv.)
      if (c.padded) {
        EXPECT_EQ(run.dk[1].narrow(0, 0, 3).abs().sum().item<double>(), 0.0);
        EXPECT_EQ(run.dq[1].narrow(0, 0, 3).abs().sum().item<double>(), 0.0);
      }
    }
  }
}

// More keys than queries (a prefix of 16 keys before the t queries, each query seeing the prefix
// and the keys up to its own position; grouped key/value heads; with and without dropout):
// output and gradients against float64 within 2^-6 (bf16) or 2^-18 (float32) of each one's
// largest magnitude, and the gradients are plain contiguous tensors (the shared dq/dk/dv buffer
// is for keys == seq only).
TEST_P(CpuAttention, MoreKeysThanQueries) {
  const torch::ScalarType dt = GetParam();
  SKIP_WITHOUT_FUSED_ATTENTION();
  const int64_t b = 2, t = 20, keys = 36, h = 4, kvh = 2, hd = 8;
  const auto shared =
      torch::ones({t, keys}, torch::kBool).triu(keys - t + 1).view({1, 1, t, keys});
  // Per batch: batch 1 also has its first 5 keys masked (its mask rows at another offset).
  auto per_batch = shared.repeat({b, 1, 1, 1});
  per_batch[1].narrow(2, 0, 5).fill_(true);
  for (const auto& [mask, p] : {std::pair{shared, 0.0}, std::pair{shared, 0.2},
                                std::pair{per_batch, 0.0}, std::pair{per_batch, 0.2}}) {
    SCOPED_TRACE(::testing::Message() << "p " << p << " mask batch " << mask.size(0));
    torch::manual_seed(21);
    const auto q0 = torch::randn({b, t, h, hd}).to(dt);
    const auto k0 = torch::randn({b, keys, kvh, hd}).to(dt);
    const auto v0 = torch::randn({b, keys, kvh, hd}).to(dt);
    const auto g = torch::randn({b, t, h * hd}).to(dt);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
         v = v0.clone().requires_grad_(true);
    torch::manual_seed(17);
    const auto out = cpu_attention(q, k, v, mask, scale, p, /*training=*/true);
    out.backward(g);
    torch::manual_seed(17);
    const auto keep = mllm::dropout(torch::ones({b, h, t, keys}, torch::kDouble), p, true);
    auto qd = q0.to(torch::kDouble).requires_grad_(true),
         kd = k0.to(torch::kDouble).requires_grad_(true),
         vd = v0.to(torch::kDouble).requires_grad_(true);
    const auto ref = reference(qd, kd, vd, mask, keep, scale);
    ref.backward(g.to(torch::kDouble));
    const torch::Tensor got[] = {out.detach(), q.grad(), k.grad(), v.grad()};
    const torch::Tensor want[] = {ref.detach(), qd.grad(), kd.grad(), vd.grad()};
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(i);
      const double largest = want[i].abs().max().item<double>();
      const int exponent = dt == torch::kBFloat16 ? -6 : -18;
      const auto tol = torch::full_like(want[i], largest * std::ldexp(1.0, exponent));
      EXPECT_TRUE(within(got[i], want[i], tol));
      if (i > 0) EXPECT_TRUE(got[i].is_contiguous());
    }
  }
}

// The dropped probabilities are mllm::dropout's, element for element: with v the identity
// (keys = head_dim) the output is the probabilities themselves, exactly (one term per sum), so
// the output with dropout must equal keep ? E(P * 1 / (1 - p)) : 0 (E: rounded to the dtype,
// bf16 or float32) for the output P without dropout and the mask mllm::dropout draws from the
// same seed over [b, h, t, keys].
TEST_P(CpuAttention, DropoutMaskIsMllmDropouts) {
  const torch::ScalarType dt = GetParam();
  SKIP_WITHOUT_FUSED_ATTENTION();
  const int64_t b = 2, t = 32, h = 3, hd = 32;
  torch::manual_seed(2);
  auto q = torch::randn({b, t, h, hd}).to(dt);
  auto k = torch::randn({b, t, h, hd}).to(dt);
  auto v = torch::eye(t).view({1, t, 1, hd}).expand({b, t, h, hd}).contiguous();
  v = v.to(dt);
  auto mask = torch::ones({t, t}, torch::kBool).triu(1).view({1, 1, t, t});
  const double p = 0.3, scale = 0.125;
  torch::NoGradGuard no_grad;
  auto probs = cpu_attention(q, k, v, mask, scale, 0.0, /*training=*/true);
  torch::manual_seed(9);
  auto dropped = cpu_attention(q, k, v, mask, scale, p, /*training=*/true);
  torch::manual_seed(9);
  auto keep = mllm::dropout(torch::ones({b, h, t, t}), p, true).ne(0);  // [b, h, t, keys]
  // [b, t, h * keys] -> [b, h, t, keys]
  auto as_bhtk = [&](const torch::Tensor& x) { return x.view({b, t, h, t}).transpose(1, 2); };
  auto scaled = (as_bhtk(probs).to(torch::kFloat) * static_cast<float>(1.0 / (1.0 - p)))
                    .to(dt);
  auto want = torch::where(keep, scaled, torch::zeros_like(scaled));
  EXPECT_TRUE(as_bhtk(dropped).equal(want));
  EXPECT_GT(keep.logical_not().logical_and(as_bhtk(probs).ne(0)).sum().item<int64_t>(), 100);
  // Evaluation draws nothing and drops nothing.
  EXPECT_TRUE(cpu_attention(q, k, v, mask, scale, p, /*training=*/false).equal(probs));
}

TEST_P(CpuAttention, SameBitsAtAnyThreadCount) {
  const torch::ScalarType dt = GetParam();
  SKIP_WITHOUT_FUSED_ATTENTION();
  // Many tasks; two query heads sharing one key/value head (batch 1: two backward tasks and the
  // pass that adds their dk and dv); one head (the backward as a single task, which oneMKL may
  // thread).
  for (const Case& c : {Case{3, 40, 4, 2, 16, true}, Case{1, 384, 2, 1, 64, true},
                        Case{1, 384, 1, 1, 64, true}}) {
    torch::manual_seed(5);
    const auto qkv = torch::randn({c.b, c.t, (c.h + 2 * c.kvh) * c.hd}).to(dt);
    const auto g = torch::randn({c.b, c.t, c.h * c.hd}).to(dt);
    const int threads = torch::get_num_threads();
    torch::set_num_threads(1);
    const Result one = fused(c, qkv, make_mask(c), g, 0.1, 3);
    torch::set_num_threads(std::max(2, threads));
    const Result two = fused(c, qkv, make_mask(c), g, 0.1, 3);
    torch::set_num_threads(threads);
    EXPECT_TRUE(one.out.equal(two.out)) << c.b << " " << c.t;
    EXPECT_TRUE(one.dq.equal(two.dq)) << c.b << " " << c.t;
    EXPECT_TRUE(one.dk.equal(two.dk)) << c.b << " " << c.t;
    EXPECT_TRUE(one.dv.equal(two.dv)) << c.b << " " << c.t;
  }
}

TEST_P(CpuAttention, RejectsWhatItCannotTake) {
  const torch::ScalarType dt = GetParam();
  SKIP_WITHOUT_FUSED_ATTENTION();
  auto q = torch::randn({1, 4, 2, 8}).to(dt);
  auto mask = torch::ones({4, 4}, torch::kBool).triu(1).view({1, 1, 4, 4});
  EXPECT_TRUE(cpu_attention_applies(q, q, q, mask));
  const auto other = dt == torch::kFloat ? torch::kBFloat16 : torch::kFloat;
  EXPECT_FALSE(cpu_attention_applies(q.to(other), q, q, mask));  // q's dtype not k's
  EXPECT_FALSE(cpu_attention_applies(q, q.to(other), q.to(other), mask));
  const auto q64 = q.to(torch::kDouble);
  EXPECT_FALSE(cpu_attention_applies(q64, q64, q64, mask));  // neither bf16 nor float32
  EXPECT_FALSE(cpu_attention_applies(q, q, q, mask.to(torch::kFloat)));  // not a bool mask
  auto odd = torch::randn({1, 3, 2, 8}).to(dt);  // 3 keys
  EXPECT_FALSE(cpu_attention_applies(odd, odd, odd, torch::ones({1, 1, 3, 3}, torch::kBool)));
  auto none = torch::randn({1, 0, 2, 8}).to(dt);  // no keys
  const auto no_mask = torch::ones({1, 1, 0, 0}, torch::kBool);
  EXPECT_FALSE(cpu_attention_applies(none, none, none, no_mask));
  auto kv3 = torch::randn({1, 4, 3, 8}).to(dt);  // 3 kv heads for 2 heads
  EXPECT_FALSE(cpu_attention_applies(q, kv3, kv3, mask));
  EXPECT_THROW(cpu_attention(q, kv3, kv3, mask, 1.0, 0.0, false), Error);
  EXPECT_THROW(cpu_attention(q, q, q, mask, 1.0, 1.0, true), Error);
}

}  // namespace
}  // namespace mllm
