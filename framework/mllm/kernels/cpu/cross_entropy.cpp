// The cross-entropy's row passes on the CPU (kernels/cpu/cross_entropy.h): per-row statistics and
// gradients of bf16 and float32 logits in one or two reads of each row while it is in cache, and
// the float32 head and loss over chunks of rows whose logits never leave the cache.
#include "mllm/kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "mllm/core/special_tokens.h"
#include "mllm/kernels/cpu/mkl_gemm.h"
#include "mllm/kernels/cpu/vec16.h"

namespace mllm::cpu {

namespace {
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

}  // namespace

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

bool bf16_rows_apply(const torch::Tensor& x) {
  return x.is_cpu() && x.scalar_type() == torch::kBFloat16 && x.size(1) > 0;
}

bool f32_rows_apply(const torch::Tensor& x) {
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

torch::Tensor ce_grad_bf16(const torch::Tensor& x, const torch::Tensor& lse,
                          const torch::Tensor& scale, const torch::Tensor& targets) {
  const int64_t rows = x.size(0), vocab = x.size(1);
  torch::Tensor grad = torch::empty_like(x);
  const torch::Tensor t = targets.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  auto* gp = reinterpret_cast<uint16_t*>(grad.data_ptr());
  at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
    ce_grad_rows_bf16(xp, lse.const_data_ptr<float>(), scale.const_data_ptr<float>(),
                      t.const_data_ptr<int64_t>(), begin, end, vocab, gp);
  });
  return grad;
}

torch::Tensor ce_grad_f32(const torch::Tensor& x, const torch::Tensor& mx,
                          const torch::Tensor& factor, const torch::Tensor& scale,
                          const torch::Tensor& targets) {
  const int64_t rows = x.size(0), vocab = x.size(1);
  const torch::Tensor t = targets.contiguous();
  torch::Tensor grad = torch::empty_like(x);
  at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
    ce_grad_rows_f32(x.const_data_ptr<float>(), mx.const_data_ptr<float>(),
                     factor.const_data_ptr<float>(), scale.const_data_ptr<float>(),
                     t.const_data_ptr<int64_t>(), begin, end, vocab, grad.data_ptr<float>());
  });
  return grad;
}

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

}  // namespace mllm::cpu
