// Summed token cross-entropy that ignores pad targets, as one autograd node (loss.h): on the CPU
// row passes that keep the logits and per-row statistics and recompute the softmax in the
// backward pass; elsewhere float32 logits keep the softmax, which the backward pass turns into
// the gradient in place. And the float32 CPU head and loss as one (lm_head_loss_sum): the same
// row passes over chunks of rows whose logits never leave the cache, the gradients computed in
// the forward pass.
#include "mllm/model/loss.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/util/BFloat16.h>

#include "mllm/core/error.h"
#include "mllm/model/mkl_gemm.h"
#include "mllm/model/model.h"
#include "mllm/model/vec16.h"

namespace mllm {

namespace {
std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Rows per chunk of the ATen-op paths (half logits on the CPU): about 1 MiB of float32 logits,
// so that the max, exp, sum and scale passes over a chunk run in cache instead of streaming the
// whole [rows, vocab] matrix four times. On an accelerator one chunk (each op is one kernel
// launch there).
int64_t chunk_rows(const torch::Tensor& x) {
  if (!x.device().is_cpu()) return std::max<int64_t>(1, x.size(0));
  return std::max<int64_t>(1, (int64_t{1} << 18) / x.size(1));
}

// x [rows, vocab] float32 contiguous, targets [rows] int64 -> per-row loss [rows] float32
// (lse - x[target], 0 on pad rows). When `probs` is defined ([rows, vocab] float32) it
// receives softmax(x); one exp per element either way.
torch::Tensor row_losses(const torch::Tensor& x, const torch::Tensor& targets,
                         const torch::Tensor& probs) {
  const int64_t rows = x.size(0), vocab = x.size(1), step = chunk_rows(x);
  torch::Tensor lse = torch::empty({rows}, x.options());
  torch::Tensor scratch;
  if (!probs.defined()) scratch = torch::empty({std::min(step, rows), vocab}, x.options());
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    torch::Tensor xc = x.narrow(0, start, n);
    torch::Tensor pc = probs.defined() ? probs.narrow(0, start, n) : scratch.narrow(0, 0, n);
    torch::Tensor max = xc.amax(1, /*keepdim=*/true);  // [n, 1]
    at::sub_out(pc, xc, max).exp_();
    torch::Tensor sum = pc.sum(1, /*keepdim=*/true);
    lse.narrow(0, start, n).copy_((sum.log() + max).squeeze(1));
    if (probs.defined()) pc.div_(sum);
  }
  torch::Tensor target_logit = x.gather(1, targets.unsqueeze(1)).squeeze(1);
  return (lse - target_logit).masked_fill_(targets.eq(kPadId), 0.0);
}

// 16 lanes, or one value, of a row of bf16 logits (bit patterns) or float32 logits, as float32.
[[gnu::always_inline]] inline vec16::Floats lanes_at(const uint16_t* p) {
  return vec16::from_bf16(vec16::load<vec16::Halves>(p));
}
[[gnu::always_inline]] inline vec16::Floats lanes_at(const float* p) {
  return vec16::load<vec16::Floats>(p);
}
[[gnu::always_inline]] inline float value_at(const uint16_t* p) {
  return c10::detail::f32_from_bits(*p);
}
[[gnu::always_inline]] inline float value_at(const float* p) { return *p; }

// A row of logits [vocab] (bf16 bit patterns or float32) -> its maximum m and sum_k exp(x_k -
// m), in float32 with the maximum and the sum in 16 lanes (a fixed order) and vec16's exp (1-2
// units in the last place): one read of the row for the maximum and one for the sum, while it
// is in cache. Inlined into the target_clones kernels below, so compiled for each of their
// targets.
template <typename T>
[[gnu::always_inline]] inline void row_max_and_sum(const T* __restrict row, int64_t vocab,
                                                   float& mx, float& sum) {
  using namespace vec16;  // NOLINT(build/namespaces)
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t vend = vocab / kLanes * kLanes;
  Floats lanes = splat(kNegInf);
  for (int64_t k = 0; k < vend; k += kLanes) {
    const Floats v = lanes_at(row + k);
    lanes = v > lanes ? v : lanes;
  }
  mx = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  for (int64_t k = vend; k < vocab; ++k) {
    const float v = value_at(row + k);
    mx = v > mx ? v : mx;
  }
  Floats sums = {};
  for (int64_t k = 0; k < vend; k += kLanes) sums += exp_nonpositive(lanes_at(row + k) - mx);
  sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += sums[l];
  for (int64_t k = vend; k < vocab; ++k) sum += exp_nonpositive(value_at(row + k) - mx);
}

// Rows rb..re-1 of bf16 logits x [rows, vocab] (bit patterns) -> lse [rows] float32: the
// row's maximum m, then log(sum_k exp(x_k - m)) + m (row_max_and_sum). Compiled three times
// (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA, baseline): the v3 and v4 versions give the same
// bits; the baseline version (no FMA) may differ in the last bit of a float32 value. (About
// 1.7x LibTorch's amax / exp / sum over float32 copies of the rows, forward and backward
// together, at [2048, 8192].)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void lse_rows_bf16(const uint16_t* __restrict x, int64_t rb, int64_t re, int64_t vocab,
                   float* __restrict lse) {
  for (int64_t r = rb; r < re; ++r) {
    float mx, sum;
    row_max_and_sum(x + r * vocab, vocab, mx, sum);
    lse[r] = std::log(sum) + mx;
  }
}

// Rows rb..re-1 of the gradient of the summed loss for bf16 logits x [rows, vocab] (bit
// patterns), lse [rows] (lse_rows_bf16), scale [rows] (the upstream gradient, 0 on pad rows),
// targets [rows] -> grad [rows, vocab] bf16 = bf16(exp(x - lse) * scale), and at the target
// bf16(exp(x - lse) * scale + -scale): softmax minus one-hot in float32, rounded once. Compiled
// as lse_rows_bf16.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void ce_grad_rows_bf16(const uint16_t* __restrict x, const float* __restrict lse,
                       const float* __restrict scale, const int64_t* __restrict targets,
                       int64_t rb, int64_t re, int64_t vocab, uint16_t* __restrict grad) {
  using namespace vec16;  // NOLINT(build/namespaces)
  using c10::detail::f32_from_bits;
  using c10::detail::round_to_nearest_even;
  const int64_t vend = vocab / kLanes * kLanes;
  for (int64_t r = rb; r < re; ++r) {
    const uint16_t* row = x + r * vocab;
    uint16_t* out = grad + r * vocab;
    const float l = lse[r], s = scale[r];
    for (int64_t k = 0; k < vend; k += kLanes)
      store(out + k, to_bf16(exp_nonpositive(from_bf16(load<Halves>(row + k)) - l) * s));
    for (int64_t k = vend; k < vocab; ++k)
      out[k] = round_to_nearest_even(exp_nonpositive(f32_from_bits(row[k]) - l) * s);
    const int64_t t = targets[r];
    out[t] = round_to_nearest_even(exp_nonpositive(f32_from_bits(row[t]) - l) * s + -s);
  }
}

// Rows rb..re-1 of float32 logits x [rows, vocab] -> mx [rows] = the row's maximum m, sum
// [rows] = sum_k exp(x_k - m) (row_max_and_sum): softmax(x) = exp(x - m) / sum, log-sum-exp =
// log(sum) + m (x - m is exact near the maximum, as in ATen's softmax). Compiled as
// lse_rows_bf16.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void softmax_stats_rows_f32(const float* __restrict x, int64_t rb, int64_t re, int64_t vocab,
                            float* __restrict mx, float* __restrict sum) {
  for (int64_t r = rb; r < re; ++r) row_max_and_sum(x + r * vocab, vocab, mx[r], sum[r]);
}

// Rows rb..re-1 of the gradient of the summed loss for float32 logits x [rows, vocab], mx [rows]
// and factor [rows] = scale / sum (softmax_stats_rows_f32; scale the upstream gradient, 0 on pad
// rows), scale [rows], targets [rows] -> grad [rows, vocab] float32 = exp(x - mx) * factor, and
// at the target that minus scale: (softmax - one-hot) * scale. Compiled as lse_rows_bf16.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void ce_grad_rows_f32(const float* __restrict x, const float* __restrict mx,
                      const float* __restrict factor, const float* __restrict scale,
                      const int64_t* __restrict targets, int64_t rb, int64_t re, int64_t vocab,
                      float* __restrict grad) {
  using namespace vec16;  // NOLINT(build/namespaces)
  const int64_t vend = vocab / kLanes * kLanes;
  for (int64_t r = rb; r < re; ++r) {
    const float* row = x + r * vocab;
    float* out = grad + r * vocab;
    const float m = mx[r], f = factor[r];
    for (int64_t k = 0; k < vend; k += kLanes)
      store(out + k, exp_nonpositive(load<Floats>(row + k) - m) * f);
    for (int64_t k = vend; k < vocab; ++k) out[k] = exp_nonpositive(row[k] - m) * f;
    out[targets[r]] -= scale[r];
  }
}

// One row of the fused head (head_loss_chunks): row [vocab] float32, the head's product without
// the bias, bias [vocab] or null, the row's target id, and valid (1 for a real target, 0 for a
// pad) -> *mx, *sum (the row's maximum m and sum of exp(x - m), as row_max_and_sum gives them
// for x + bias; the bias added in the pass that finds the maximum, as addmm adds it: one
// rounding of product + bias), *target_logit (x + bias at the target) and, with `grad`, the row
// overwritten with the gradient of the summed loss for an upstream gradient of 1:
// exp(x - m) * (valid / sum), minus valid at the target ((softmax - one-hot) on a real row, 0
// on a pad row); colsum [vocab], when non-null, += that gradient, element for element the
// values the row keeps (the bias gradient's column sums); without `grad` the row is left
// holding exp(x - m). Three passes over the row while it is
// in the cache (L1 up to a vocabulary of ~8K float32 logits, else L2): the bias and the
// maximum, exp(x - m) stored and summed, scaled. Compiled as lse_rows_bf16.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void head_row_f32(float* __restrict row, const float* __restrict bias, int64_t vocab,
                  int64_t target, float valid, float* __restrict mx, float* __restrict sum,
                  float* __restrict target_logit, bool grad, float* __restrict colsum) {
  using namespace vec16;  // NOLINT(build/namespaces)
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t vend = vocab / kLanes * kLanes;
  Floats lanes = splat(kNegInf);
  if (bias != nullptr) {
    for (int64_t k = 0; k < vend; k += kLanes) {
      const Floats v = load<Floats>(row + k) + load<Floats>(bias + k);
      store(row + k, v);
      lanes = v > lanes ? v : lanes;
    }
    for (int64_t k = vend; k < vocab; ++k) row[k] += bias[k];
  } else {
    for (int64_t k = 0; k < vend; k += kLanes) {
      const Floats v = load<Floats>(row + k);
      lanes = v > lanes ? v : lanes;
    }
  }
  float m = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  for (int64_t k = vend; k < vocab; ++k) m = row[k] > m ? row[k] : m;
  *target_logit = row[target];
  Floats sums = {};
  for (int64_t k = 0; k < vend; k += kLanes) {
    const Floats e = exp_nonpositive(load<Floats>(row + k) - m);
    store(row + k, e);
    sums += e;
  }
  float s = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) s += sums[l];
  for (int64_t k = vend; k < vocab; ++k) {
    row[k] = exp_nonpositive(row[k] - m);
    s += row[k];
  }
  *mx = m;
  *sum = s;
  if (!grad) return;
  const float f = valid / s;
  const float target_colsum = colsum != nullptr ? colsum[target] : 0.0f;
  if (colsum == nullptr) {
    for (int64_t k = 0; k < vend; k += kLanes) store(row + k, load<Floats>(row + k) * f);
    for (int64_t k = vend; k < vocab; ++k) row[k] *= f;
  } else {
    for (int64_t k = 0; k < vend; k += kLanes) {
      const Floats g = load<Floats>(row + k) * f;
      store(row + k, g);
      store(colsum + k, load<Floats>(colsum + k) + g);
    }
    for (int64_t k = vend; k < vocab; ++k) {
      row[k] *= f;
      colsum[k] += row[k];
    }
  }
  row[target] -= valid;
  if (colsum != nullptr) colsum[target] = target_colsum + row[target];
}

// Rows per parallel chunk: about 64 K logits.
int64_t grain_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 16) / vocab); }

// x [rows, vocab] bf16 contiguous on the CPU -> per-row log-sum-exp [rows] float32
// (lse_rows_bf16).
torch::Tensor row_lse_bf16(const torch::Tensor& x) {
  const int64_t rows = x.size(0), vocab = x.size(1);
  torch::Tensor lse = torch::empty({rows}, x.options().dtype(torch::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
    lse_rows_bf16(xp, begin, end, vocab, lp);
  });
  return lse;
}

// Whether bf16 logits take the fused row kernels: CPU and a non-empty vocabulary.
bool fused_bf16(const torch::Tensor& x) {
  return x.is_cpu() && x.scalar_type() == torch::kBFloat16 && x.size(1) > 0;
}

// Whether float32 logits take the fused row kernels: CPU and a non-empty vocabulary.
bool fused_f32(const torch::Tensor& x) {
  return x.is_cpu() && x.scalar_type() == torch::kFloat && x.size(1) > 0;
}

// x [rows, vocab] float32 contiguous on the CPU -> {row maxima [rows], sums of exp(x - max)
// [rows]} float32 (softmax_stats_rows_f32).
std::pair<torch::Tensor, torch::Tensor> softmax_stats_f32(const torch::Tensor& x) {
  const int64_t rows = x.size(0), vocab = x.size(1);
  torch::Tensor mx = torch::empty({rows}, x.options()), sum = torch::empty({rows}, x.options());
  const float* xp = x.const_data_ptr<float>();
  float *mp = mx.data_ptr<float>(), *sp = sum.data_ptr<float>();
  at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
    softmax_stats_rows_f32(xp, begin, end, vocab, mp, sp);
  });
  return {mx, sum};
}

// x [rows, vocab] bf16 or half contiguous -> per-row log-sum-exp [rows] float32: lse_rows_bf16
// for bf16 on the CPU; otherwise the max / exp / sum over float32 copies of cache-sized chunks.
torch::Tensor row_lse_reduced(const torch::Tensor& x) {
  if (fused_bf16(x)) return row_lse_bf16(x);
  const int64_t rows = x.size(0), vocab = x.size(1), step = chunk_rows(x);
  const auto f32 = x.options().dtype(torch::kFloat);
  torch::Tensor lse = torch::empty({rows}, f32);
  torch::Tensor scratch = torch::empty({std::min(step, rows), vocab}, f32);
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    torch::Tensor xc = scratch.narrow(0, 0, n).copy_(x.narrow(0, start, n));
    torch::Tensor max = xc.amax(1, /*keepdim=*/true);  // [n, 1]
    torch::Tensor sum = xc.sub_(max).exp_().sum(1, /*keepdim=*/true);
    lse.narrow(0, start, n).copy_((sum.log() + max).squeeze(1));
  }
  return lse;
}

// x [rows, vocab] bf16, half or float32, targets [rows] int64, lse [rows] float32 -> []
// float32: the sum over non-pad rows of lse - x[target].
torch::Tensor reduced_loss_sum(const torch::Tensor& x, const torch::Tensor& targets,
                               const torch::Tensor& lse) {
  torch::Tensor target_logit = x.gather(1, targets.unsqueeze(1)).squeeze(1).to(torch::kFloat);
  return (lse - target_logit).masked_fill_(targets.eq(kPadId), 0.0).sum();
}

// The same loss for bf16 / half logits (bf16 autocast), with float32 arithmetic throughout:
// the forward pass keeps the logits as they are and one log-sum-exp per row; the backward pass
// recomputes exp(x - lse) in float32, subtracts the one-hot there, and rounds the gradient to
// the logits' dtype once — the float32 path's gradient rounded for the bf16 head (to the last
// bit of its exp: bf16 logits on the CPU take lse_rows_bf16 and ce_grad_rows_bf16, one pass over
// each row each way; half logits ATen's ops over float32 chunks), without a [rows, vocab]
// float32 copy of the logits, a float32 softmax buffer, or their casts.
class SummedCrossEntropyReduced : public torch::autograd::Function<SummedCrossEntropyReduced> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& targets) {
    torch::Tensor lse = row_lse_reduced(x);
    ctx->save_for_backward({x, lse, targets});
    return reduced_loss_sum(x, targets, lse);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& lse = saved[1];
    const torch::Tensor& targets = saved[2];
    const int64_t rows = x.size(0), vocab = x.size(1), step = chunk_rows(x);
    // Per-row factor: the upstream gradient on real targets, 0 on pad targets.
    torch::Tensor scale = targets.ne(kPadId).to(torch::kFloat).mul_(grad_out[0].to(torch::kFloat));
    torch::Tensor grad = torch::empty_like(x);
    if (fused_bf16(x)) {
      const torch::Tensor t = targets.contiguous();
      const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
      auto* gp = reinterpret_cast<uint16_t*>(grad.data_ptr());
      at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
        ce_grad_rows_bf16(xp, lse.const_data_ptr<float>(), scale.const_data_ptr<float>(),
                          t.const_data_ptr<int64_t>(), begin, end, vocab, gp);
      });
      return {grad, torch::Tensor()};
    }
    torch::Tensor scratch = torch::empty({std::min(step, rows), vocab}, lse.options());
    for (int64_t start = 0; start < rows; start += step) {
      const int64_t n = std::min(step, rows - start);
      torch::Tensor sc = scale.narrow(0, start, n).unsqueeze(1);  // [n, 1]
      torch::Tensor gc = scratch.narrow(0, 0, n).copy_(x.narrow(0, start, n));
      gc.sub_(lse.narrow(0, start, n).unsqueeze(1)).exp_().mul_(sc);
      gc.scatter_add_(1, targets.narrow(0, start, n).unsqueeze(1), sc.neg());
      grad.narrow(0, start, n).copy_(gc);
    }
    return {grad, torch::Tensor()};
  }
};

// The same loss for float32 logits on the CPU, with the row kernels above: the forward pass
// keeps the logits and each row's maximum and sum of exponentials (no [rows, vocab] softmax
// buffer: two reads of each row in cache instead of ATen's max / subtract / exp / sum / divide
// passes over it); the backward pass recomputes exp(x - max) and writes the gradient in one
// pass. The logits must not be modified in place between the passes (autograd's version check
// says so).
class SummedCrossEntropyCpu : public torch::autograd::Function<SummedCrossEntropyCpu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& targets) {
    auto [mx, sum] = softmax_stats_f32(x);
    ctx->save_for_backward({x, mx, sum, targets});
    return reduced_loss_sum(x, targets, sum.log().add_(mx));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& targets = saved[3];
    const int64_t rows = x.size(0), vocab = x.size(1);
    // Per-row factor: the upstream gradient on real targets, 0 on pad targets.
    const torch::Tensor scale =
        targets.ne(kPadId).to(torch::kFloat).mul_(grad_out[0].to(torch::kFloat));
    const torch::Tensor factor = scale / saved[2];
    const torch::Tensor t = targets.contiguous();
    torch::Tensor grad = torch::empty_like(x);
    at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
      ce_grad_rows_f32(x.const_data_ptr<float>(), saved[1].const_data_ptr<float>(),
                       factor.const_data_ptr<float>(), scale.const_data_ptr<float>(),
                       t.const_data_ptr<int64_t>(), begin, end, vocab, grad.data_ptr<float>());
    });
    return {grad, torch::Tensor()};
  }
};

// loss = sum over non-pad rows of -log softmax(x)[target]; d loss / d x = softmax(x) - onehot
// on non-pad rows, 0 on pad rows (the derivative of log-sum-exp).
class SummedCrossEntropy : public torch::autograd::Function<SummedCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& targets) {
    torch::Tensor probs = torch::empty_like(x);
    torch::Tensor loss = row_losses(x, targets, probs).sum();
    ctx->save_for_backward({probs, targets});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    MLLM_CHECK(!ctx->saved_data.count("used"),
               "lm_loss_sum: backward ran twice through one loss (retain_graph is not supported: "
               "the saved softmax becomes the gradient in place)");
    ctx->saved_data["used"] = true;
    auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];  // softmax [rows, vocab], turned into the gradient in place
    const torch::Tensor& targets = saved[1];
    // Per-row factor: the upstream gradient on real targets, 0 on pad targets.
    torch::Tensor scale =
        targets.ne(kPadId).to(grad.scalar_type()).mul_(grad_out[0].to(grad.scalar_type()))
            .unsqueeze(1);  // [rows, 1]
    grad.mul_(scale).scatter_add_(1, targets.unsqueeze(1), scale.neg());
    return {grad, torch::Tensor()};
  }
};

// Rows per chunk of the fused head (lm_head_loss_sum): max(64, L / vocab) with L = 2^20 logits
// (4 MiB of float32) on one thread, so that a chunk stays in the caches (L2, or a large L3)
// from the head's product through the row passes to the two gradient products, and L = 2^22
// (16 MiB) on more threads, where every chunk costs five parallel regions. Measured with
// mllm_bench_head_loss on a 2-vCPU Xeon (bench/README.md): mini's [1024, 128] -> 4096 on one
// thread 1.49x the unfused head with 256 rows, 1.28x with 1024; the small shape's [2048, 512] ->
// 8192 on two threads 1.09-1.11x with 128-256 rows and 1.19x with 512, and with another process
// busy on one of the two cores 0.68x (128 rows), 0.89x (256) and 1.04x (512).
int64_t head_chunk_rows(int64_t vocab) {
  const int64_t logits = at::get_num_threads() > 1 ? int64_t{1} << 22 : int64_t{1} << 20;
  return std::max<int64_t>(64, logits / std::max<int64_t>(vocab, 1));
}

// The fused head's loss and, where asked for, the gradients for an upstream gradient of 1.
struct HeadLoss {
  torch::Tensor loss;        // [] float32
  torch::Tensor dx, dw, db;  // [rows, d], [vocab, d], [vocab] float32; undefined unless asked
};

// x [rows, d] float32 contiguous, weight [vocab, d] float32 contiguous, bias [vocab] float32 or
// undefined, targets [rows] int64 contiguous (ids checked) on the CPU -> HeadLoss, chunk by chunk
// of head_chunk_rows rows: logits = x_c weight^T into one reused buffer; then row by row the
// bias added in the pass that takes the row's maximum and sum of exp
// (as addmm, one rounding of product + bias), its target logit and, for gradients, the row
// turned into (softmax - one-hot) in place while it is in cache (head_row_f32, which also sums
// the columns for db); then dx_c = g_c weight and dw += g_c^T x_c. The loss is the unfused
// path's formula over the same per-row values: sum over real rows of log(sum) + max - x[target].
HeadLoss head_loss_chunks(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const torch::Tensor& targets, bool want_dx,
                          bool want_dw, bool want_db) {
  const int64_t rows = x.size(0), d = x.size(1), vocab = weight.size(0);
  const int64_t step = std::max<int64_t>(1, std::min(rows, head_chunk_rows(vocab)));
  const auto opts = x.options();
  torch::Tensor logits = torch::empty({step, vocab}, opts);
  torch::Tensor mx = torch::empty({rows}, opts), sum = torch::empty({rows}, opts);
  torch::Tensor target_logit = torch::empty({rows}, opts);
  const torch::Tensor valid = targets.ne(kPadId).to(torch::kFloat);
  HeadLoss out;
  if (want_dx) out.dx = torch::empty({rows, d}, opts);
  if (want_dw) out.dw = rows > 0 ? torch::empty({vocab, d}, opts) : torch::zeros({vocab, d}, opts);
  if (want_db) out.db = torch::zeros({vocab}, opts);
  const torch::Tensor wt = weight.t();
  // The logits' B operand, weight^T, packed once for every full chunk where oneMKL's packed GEMM
  // is exported (mkl_gemm.h): the chunks' products then skip repacking the [vocab, d] weight
  // (one pack ~0.24 ms, each product ~15% faster at mini's [256, 128] x [128, 4096] on one
  // thread of a 2-vCPU Xeon). The input gradient's products take ATen's mm (packed, its B =
  // weight was slower there).
  std::optional<MklPackedB> packed_wt;
  if (rows > step && step > 1 && MklPackedB::available() && step <= INT_MAX &&
      vocab <= INT_MAX && d <= INT_MAX)
    packed_wt.emplace(/*trans_b=*/true, static_cast<int>(step), static_cast<int>(vocab),
                      static_cast<int>(d), weight.const_data_ptr<float>(), static_cast<int>(d));
  float *mp = mx.data_ptr<float>(), *sp = sum.data_ptr<float>();
  float* tlp = target_logit.data_ptr<float>();
  const float* vp = valid.const_data_ptr<float>();
  const float* bp = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  const int64_t* tp = targets.const_data_ptr<int64_t>();
  const int64_t grain = grain_rows(vocab);
  // Rows per block of the bias gradient's partial sums ([blocks, vocab] float32 scratch): 32,
  // or grain_rows when larger (a small vocabulary), and on more threads at most a quarter of a
  // thread's share of a chunk, so that a large vocabulary's few-row chunks still split (vocab
  // 50,257 on two threads: 83-row chunks, 11-row blocks).
  const int64_t threads = at::get_num_threads();
  int64_t db_rows = std::max<int64_t>(grain, 32);
  if (threads > 1) db_rows = std::min(db_rows, std::max<int64_t>(1, step / (4 * threads)));
  torch::Tensor partial;
  if (want_db) partial = torch::empty({(step + db_rows - 1) / db_rows, vocab}, opts);
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    const torch::Tensor xc = x.narrow(0, start, n);
    torch::Tensor lc = logits.narrow(0, 0, n);
    if (packed_wt.has_value() && n == step)
      packed_wt->compute(xc.const_data_ptr<float>(), static_cast<int>(d), 0.0f,
                         lc.data_ptr<float>(), static_cast<int>(vocab));
    else
      at::mm_out(lc, xc, wt);
    float* lp = lc.data_ptr<float>();
    // Rows r0..r1-1 of the chunk: the bias, the row's maximum and sum of exp, its target logit
    // and, for gradients, the row turned into its gradient (into colsum's column sums) while it
    // is still in the L1/L2 cache, row by row (head_row_f32).
    const bool grads = want_dx || want_dw || want_db;
    auto row_pass = [&](int64_t r0, int64_t r1, float* colsum) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = start + r;
        head_row_f32(lp + r * vocab, bp, vocab, tp[i], vp[i], mp + i, sp + i, tlp + i, grads,
                     colsum);
      }
    };
    if (!want_db) {
      at::parallel_for(0, n, grain,
                       [&](int64_t begin, int64_t end) { row_pass(begin, end, nullptr); });
    } else {
      // The bias gradient from the same pass: block i's rows summed into partial row i, then
      // the blocks added in order (the same bits however the blocks are shared among the
      // threads; the block and chunk sizes themselves depend on the thread count).
      const int64_t blocks = (n + db_rows - 1) / db_rows;
      float* pp = partial.data_ptr<float>();
      at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          std::fill(pp + i * vocab, pp + (i + 1) * vocab, 0.0f);
          row_pass(i * db_rows, std::min(n, (i + 1) * db_rows), pp + i * vocab);
        }
      });
      float* dbp = out.db.data_ptr<float>();
      for (int64_t i = 0; i < blocks; ++i)
        for (int64_t k = 0; k < vocab; ++k) dbp[k] += pp[i * vocab + k];
    }
    if (want_dx) {
      torch::Tensor dxc = out.dx.narrow(0, start, n);
      at::mm_out(dxc, lc, weight);
    }
    if (want_dw) {
      if (start == 0)
        at::mm_out(out.dw, lc.t(), xc);
      else
        out.dw.addmm_(lc.t(), xc);
    }
  }
  out.loss = (sum.log().add_(mx) - target_logit).masked_fill_(targets.eq(kPadId), 0.0).sum();
  return out;
}

// The fused head and loss as one autograd node: the forward pass computes the loss and the
// gradients for an upstream gradient of 1 (head_loss_chunks) and keeps only the gradients; the
// backward pass multiplies them by the upstream gradient (with retain_graph it may run more than
// once). Not differentiable twice: the saved gradients are constants to autograd.
class SummedHeadCrossEntropyCpu : public torch::autograd::Function<SummedHeadCrossEntropyCpu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& targets) {
    // (An optional bias: apply() refuses an undefined tensor argument. needs_input_grad counts
    // the tensor arguments present, so the bias is edge 2 when there is one.)
    const torch::Tensor b = bias.value_or(torch::Tensor());
    HeadLoss r = head_loss_chunks(x, weight, b, targets, ctx->needs_input_grad(0),
                                  ctx->needs_input_grad(1),
                                  b.defined() && ctx->needs_input_grad(2));
    // Saved as autograd's saved tensors (undefined where not asked for): freed after the
    // backward pass, and a second backward without retain_graph is refused as usual.
    ctx->save_for_backward({r.dx, r.dw, r.db});
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::Tensor g = grad_out[0].to(torch::kFloat);
    const auto saved = ctx->get_saved_variables();
    auto scaled = [&](const torch::Tensor& t) { return t.defined() ? t * g : torch::Tensor(); };
    return {scaled(saved[0]), scaled(saved[1]), scaled(saved[2]), torch::Tensor()};
  }
};

// Throws mllm::Error (naming `what`) unless targets is int64 and, on the CPU, every id is in
// [0, vocab).
void check_target_ids(const torch::Tensor& t, int64_t vocab, const char* what) {
  if (t.scalar_type() != torch::kLong)
    throw Error(std::string(what) + ": targets must be int64, got " +
                std::string(c10::toString(t.scalar_type())));
  if (t.numel() > 0 && t.device().is_cpu()) {  // (on a GPU, gather's device assert)
    auto [lo, hi] = torch::aminmax(t);
    if (lo.item<int64_t>() < 0 || hi.item<int64_t>() >= vocab)
      throw Error(std::string(what) + ": target ids must be in [0, " + std::to_string(vocab) +
                  "), got " + std::to_string(lo.item<int64_t>()) + ".." +
                  std::to_string(hi.item<int64_t>()));
  }
}
}  // namespace

torch::Tensor lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) ||
      logits.size(1) != targets.size(1))
    throw Error("lm_loss_sum: logits " + shape_of(logits) + " and targets " + shape_of(targets) +
                " do not match; expected [batch, seq, vocab] and [batch, seq]");
  const int64_t vocab = logits.size(2);
  check_target_ids(targets, vocab, "lm_loss_sum");
  const bool reduced = logits.scalar_type() == torch::kBFloat16 || logits.scalar_type() == torch::kHalf;
  torch::Tensor x = reduced ? logits.reshape({-1, vocab}).contiguous()
                            : logits.reshape({-1, vocab}).to(torch::kFloat).contiguous();
  torch::Tensor t = targets.reshape({-1}).contiguous();
  const bool grad = torch::GradMode::is_enabled() && x.requires_grad();
  if (reduced) {
    if (grad) return SummedCrossEntropyReduced::apply(x, t);
    torch::NoGradGuard no_grad;
    return reduced_loss_sum(x, t, row_lse_reduced(x));
  }
  if (fused_f32(x)) {
    if (grad) return SummedCrossEntropyCpu::apply(x, t);
    torch::NoGradGuard no_grad;
    auto [mx, sum] = softmax_stats_f32(x);
    return reduced_loss_sum(x, t, sum.log().add_(mx));
  }
  if (grad) return SummedCrossEntropy::apply(x, t);
  torch::NoGradGuard no_grad;
  return row_losses(x, t, torch::Tensor()).sum();
}

bool lm_head_loss_fusable(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.is_cpu() && weight.is_cpu() && x.scalar_type() == torch::kFloat &&
         weight.scalar_type() == torch::kFloat && weight.dim() == 2 && weight.size(0) > 0 &&
         !at::autocast::is_autocast_enabled(at::kCPU);
}

torch::Tensor lm_head_loss_sum(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const torch::Tensor& targets) {
  if (x.dim() != 3 || targets.dim() != 2 || x.size(0) != targets.size(0) ||
      x.size(1) != targets.size(1) || weight.dim() != 2 || weight.size(1) != x.size(2) ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))))
    throw Error("lm_head_loss_sum: x " + shape_of(x) + ", weight " + shape_of(weight) +
                ", bias " + (bias.defined() ? shape_of(bias) : std::string("none")) +
                " and targets " + shape_of(targets) +
                " do not match; expected [batch, seq, d], [vocab, d], [vocab] or none, and "
                "[batch, seq]");
  if (!lm_head_loss_fusable(x, weight) || (bias.defined() && (!bias.is_cpu() ||
                                                             bias.scalar_type() != torch::kFloat)))
    throw Error(
        "lm_head_loss_sum: needs float32 x, weight and bias on the CPU outside autocast, got x " +
        std::string(c10::toString(x.scalar_type())) + " on " + x.device().str() + ", weight " +
        std::string(c10::toString(weight.scalar_type())) + " on " + weight.device().str() +
        ", bias " +
        (bias.defined() ? std::string(c10::toString(bias.scalar_type())) + " on " +
                              bias.device().str()
                        : std::string("none")) +
        ", CPU autocast " + (at::autocast::is_autocast_enabled(at::kCPU) ? "on" : "off") +
        " (use lm_loss_sum on the logits)");
  const int64_t vocab = weight.size(0);
  check_target_ids(targets, vocab, "lm_head_loss_sum");
  const torch::Tensor x2 = x.reshape({-1, x.size(2)}).contiguous();
  const torch::Tensor w = weight.contiguous();
  const torch::Tensor b = bias.defined() ? bias.contiguous() : bias;
  const torch::Tensor t = targets.reshape({-1}).contiguous();
  const bool grad = torch::GradMode::is_enabled() &&
                    (x2.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  const std::optional<torch::Tensor> ob = b.defined() ? std::optional(b) : std::nullopt;
  if (grad) return SummedHeadCrossEntropyCpu::apply(x2, w, ob, t);
  torch::NoGradGuard no_grad;
  return head_loss_chunks(x2, w, b, t, false, false, false).loss;
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kPadId).sum().item<int64_t>();
}

}  // namespace mllm
