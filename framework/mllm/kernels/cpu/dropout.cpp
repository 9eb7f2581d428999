// Counter-based CPU dropout (kernels/cpu/dropout.h): the mask passes and the autograd Functions.
#include "mllm/kernels/cpu/dropout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/BFloat16.h>
#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/dropout_bits.h"

namespace mllm {
namespace {

using dropout_bits::pair_bits;

// Pairs jb..je-1 of float32 data: dst[2j] = src[2j] * (keep ? scale : 0) with keep from bits
// 40..63 of mix(seed, j), dst[2j+1] likewise from bits 16..39. Branch-free and compiled three
// times (x86-64-v4 = AVX-512 with 64-bit multiplies, AVX2, baseline x86-64; chosen when the
// library loads), so the compiler vectorizes the hash: 0.8 instead of 2.1 ns per element with
// AVX2 on the Zen 3 dev VM, the same output on every path.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void mask_pairs_f32(const float* __restrict src, float* __restrict dst, int64_t jb, int64_t je,
                    uint64_t seed, uint32_t threshold, float scale) {
  for (int64_t j = jb; j < je; ++j) {
    const auto [b0, b1] = pair_bits(seed, j);
    dst[2 * j] = src[2 * j] * (b0 >= threshold ? scale : 0.0f);
    dst[2 * j + 1] = src[2 * j + 1] * (b1 >= threshold ? scale : 0.0f);
  }
}

// mask_pairs_f32 for bf16 data (bits as uint16): a dropped element is +0, a kept one
// bf16(float(src) * scale) — the bits the generic per-element loop below produces, through
// c10::BFloat16's own conversions (round to nearest even), which the compiler vectorizes.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void mask_pairs_bf16(const uint16_t* __restrict src, uint16_t* __restrict dst, int64_t jb,
                     int64_t je, uint64_t seed, uint32_t threshold, float scale) {
  for (int64_t j = jb; j < je; ++j) {
    const auto [b0, b1] = pair_bits(seed, j);
    using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
    const uint16_t v0 = round_to_nearest_even(f32_from_bits(src[2 * j]) * scale);
    const uint16_t v1 = round_to_nearest_even(f32_from_bits(src[2 * j + 1]) * scale);
    dst[2 * j] = b0 >= threshold ? v0 : uint16_t{0};
    dst[2 * j + 1] = b1 >= threshold ? v1 : uint16_t{0};
  }
}

// The residual form for bf16 branches (dropout_add): pairs jb..je-1 of
//   dst[i] = res[i] + float(keep ? bf16(float(src[i]) * scale) : 0)     (float32 res and dst)
// with the keep bits of mask_pairs_bf16, so the values are those of res + dropout(src) summed
// in float32. keep_all (p == 0 or evaluation): every element kept with scale 1, no hash.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void add_mask_pairs_bf16(const float* __restrict res, const uint16_t* __restrict src,
                         float* __restrict dst, int64_t jb, int64_t je, uint64_t seed,
                         uint32_t threshold, float scale, bool keep_all) {
  using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
  if (keep_all) {
    for (int64_t i = 2 * jb; i < 2 * je; ++i) dst[i] = res[i] + f32_from_bits(src[i]);
    return;
  }
  for (int64_t j = jb; j < je; ++j) {
    const auto [b0, b1] = pair_bits(seed, j);
    const float v0 = f32_from_bits(round_to_nearest_even(f32_from_bits(src[2 * j]) * scale));
    const float v1 = f32_from_bits(round_to_nearest_even(f32_from_bits(src[2 * j + 1]) * scale));
    dst[2 * j] = res[2 * j] + (b0 >= threshold ? v0 : 0.0f);
    dst[2 * j + 1] = res[2 * j + 1] + (b1 >= threshold ? v1 : 0.0f);
  }
}

// Its backward for the branch: pairs jb..je-1 of dst[i] = keep ? bf16(float(bf16(g[i])) * scale)
// : 0 from the float32 gradient g: the float32 gradient rounded to the branch's bf16 (as autograd
// casts it at the sum), then mask_pairs_bf16.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void grad_mask_pairs_bf16(const float* __restrict g, uint16_t* __restrict dst, int64_t jb,
                          int64_t je, uint64_t seed, uint32_t threshold, float scale,
                          bool keep_all) {
  using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
  if (keep_all) {
    for (int64_t i = 2 * jb; i < 2 * je; ++i) dst[i] = round_to_nearest_even(g[i]);
    return;
  }
  for (int64_t j = jb; j < je; ++j) {
    const auto [b0, b1] = pair_bits(seed, j);
    const float g0 = f32_from_bits(round_to_nearest_even(g[2 * j]));
    const float g1 = f32_from_bits(round_to_nearest_even(g[2 * j + 1]));
    const uint16_t v0 = round_to_nearest_even(g0 * scale), v1 = round_to_nearest_even(g1 * scale);
    dst[2 * j] = b0 >= threshold ? v0 : uint16_t{0};
    dst[2 * j + 1] = b1 >= threshold ? v1 : uint16_t{0};
  }
}

// The backward of dropout(softmax(x)) for bf16 rows of `keys` (even) elements, rows rb..re-1:
// with gy = the dropout's backward of g (keep ? bf16(float(g) * scale) : 0, pair bits as
// mask_pairs_bf16, the element index counting from the tensor's start) and y the softmax output,
//   out = bf16((gy - sum_k gy_k y_k) * y)          (PyTorch's softmax backward, in float32)
// in one pass over g and y instead of the dropout's pass and the softmax backward's. The row sum
// runs in 16 float32 lanes, added in a fixed order: the same bits on every code path (no
// multiply-add contraction, which GCC would otherwise do in the x86-64-v4 version only; a
// command-line -ffp-contract does not reach a file that includes the precompiled header).
// `gy` holds a row.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), optimize("fp-contract=off")))
#endif
void softmax_dropout_grad_rows(const uint16_t* __restrict g, const uint16_t* __restrict y,
                               uint16_t* __restrict out, int64_t rb, int64_t re, int64_t keys,
                               uint64_t seed, uint32_t threshold, float scale,
                               float* __restrict gy) {
  using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
  constexpr int kLanes = 16;
  for (int64_t r = rb; r < re; ++r) {
    const uint16_t* gr = g + r * keys;
    const uint16_t* yr = y + r * keys;
    uint16_t* outr = out + r * keys;
    const int64_t j0 = r * keys / 2;
    for (int64_t j = 0; j < keys / 2; ++j) {
      const auto [b0, b1] = pair_bits(seed, j0 + j);
      const float v0 = f32_from_bits(round_to_nearest_even(f32_from_bits(gr[2 * j]) * scale));
      const float v1 = f32_from_bits(round_to_nearest_even(f32_from_bits(gr[2 * j + 1]) * scale));
      gy[2 * j] = b0 >= threshold ? v0 : 0.0f;
      gy[2 * j + 1] = b1 >= threshold ? v1 : 0.0f;
    }
    float lanes[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= keys; k += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += gy[k + l] * f32_from_bits(yr[k + l]);
    float dot = 0.0f;
    for (int l = 0; l < kLanes; ++l) dot += lanes[l];
    for (; k < keys; ++k) dot += gy[k] * f32_from_bits(yr[k]);
    for (k = 0; k < keys; ++k)
      outr[k] = round_to_nearest_even((gy[k] - dot) * f32_from_bits(yr[k]));
  }
}

// out[i] = keep(i) ? in[i] * scale : 0 over the contiguous `in`. One 64-bit hash serves two
// elements: keep(2j) = bits 40..63 of mix(seed, j) >= threshold, keep(2j+1) = bits 16..39.
torch::Tensor apply_mask(const torch::Tensor& in_any, uint64_t seed, uint32_t threshold,
                         float scale) {
  torch::Tensor in = in_any.contiguous();
  torch::Tensor out = torch::empty_like(in, at::MemoryFormat::Contiguous);
  const int64_t n = in.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "mllm_dropout", [&] {
    const scalar_t* src = in.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    auto keep_scaled = [&](int64_t i, uint32_t bits) {
      dst[i] = bits >= threshold ? static_cast<scalar_t>(static_cast<float>(src[i]) * scale)
                                 : scalar_t(0);
    };
    // Grain and split points are even, so every pair is handled by one thread.
    at::parallel_for(0, (n + 1) / 2, 1 << 13, [&](int64_t begin, int64_t end) {
      const int64_t full = std::min(end, n / 2);  // pairs with both elements in range
      // (The casts only compile the other dtypes' copies of this lambda: not a template, so
      // `if constexpr` does not discard the branch for them.)
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (begin < full)
          mask_pairs_f32(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(dst), begin,
                         full, seed, threshold, scale);
        begin = std::max(begin, full);
      } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
        if (begin < full)
          mask_pairs_bf16(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<uint16_t*>(dst),
                          begin, full, seed, threshold, scale);
        begin = std::max(begin, full);
      }
      for (int64_t j = begin; j < end; ++j) {
        const auto [even, odd] = pair_bits(seed, j);
        keep_scaled(2 * j, even);
        if (2 * j + 1 < n) keep_scaled(2 * j + 1, odd);
      }
    });
  });
  return out;
}

// A dropout mask (DropoutDraw: seed, 24-bit drop threshold, scale 1 / (1 - p)) as the autograd
// Functions keep it for their backward.
void save_mask(torch::autograd::AutogradContext* ctx, int64_t seed, int64_t threshold,
               double scale) {
  ctx->saved_data["seed"] = seed;
  ctx->saved_data["threshold"] = threshold;
  ctx->saved_data["scale"] = scale;
}
DropoutDraw saved_mask(torch::autograd::AutogradContext* ctx) {
  return {static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
          static_cast<uint32_t>(ctx->saved_data["threshold"].toInt()),
          static_cast<float>(ctx->saved_data["scale"].toDouble())};
}

struct DropoutFunction : public torch::autograd::Function<DropoutFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t seed, int64_t threshold, double scale) {
    save_mask(ctx, seed, threshold, scale);
    return apply_mask(x, static_cast<uint64_t>(seed), static_cast<uint32_t>(threshold),
                      static_cast<float>(scale));
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    // d/dx (x * keep * scale) = keep * scale: the same mask, regenerated from the seed.
    const DropoutDraw m = saved_mask(ctx);
    torch::Tensor g = apply_mask(grads[0], m.seed, m.threshold, m.scale);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// residual + dropout(branch) for a float32 residual and a bf16 branch of one shape, both CPU and
// contiguous: one pass forward (no bf16 dropout output, no mixed-dtype add) and one backward
// (the residual's gradient passes through; the branch's is rounded and masked in one pass).
// Threshold 0 and scale 1 (p == 0 or evaluation, no seed drawn, as dropout draws none then)
// keep every element and skip the hash.
struct DropoutAddFunction : public torch::autograd::Function<DropoutAddFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& res,
                               const torch::Tensor& branch, int64_t seed, int64_t threshold,
                               double scale) {
    save_mask(ctx, seed, threshold, scale);
    const bool keep_all = threshold == 0 && scale == 1.0;
    torch::Tensor out = torch::empty_like(res, at::MemoryFormat::Contiguous);
    const float* r = res.const_data_ptr<float>();
    const auto* b = reinterpret_cast<const uint16_t*>(branch.const_data_ptr());
    float* o = out.data_ptr<float>();
    const int64_t n = res.numel();
    at::parallel_for(0, (n + 1) / 2, 1 << 13, [&](int64_t begin, int64_t end) {
      const int64_t full = std::min(end, n / 2);
      if (begin < full)
        add_mask_pairs_bf16(r, b, o, begin, full, static_cast<uint64_t>(seed),
                            static_cast<uint32_t>(threshold), static_cast<float>(scale), keep_all);
      if (end > full && n % 2 == 1) {  // the last, unpaired element (the even bits)
        using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
        const int64_t i = n - 1;
        const bool keep = keep_all || pair_bits(static_cast<uint64_t>(seed), i / 2).even >=
                                          static_cast<uint32_t>(threshold);
        const float v = keep_all ? f32_from_bits(b[i])
                                 : f32_from_bits(round_to_nearest_even(f32_from_bits(b[i]) *
                                                                       static_cast<float>(scale)));
        o[i] = r[i] + (keep ? v : 0.0f);
      }
    });
    return out;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    if (!ctx->needs_input_grad(1))
      return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const torch::Tensor g = grads[0].to(torch::kFloat).contiguous();
    const auto [seed, threshold, scale] = saved_mask(ctx);
    const bool keep_all = threshold == 0 && scale == 1.0f;
    torch::Tensor db = torch::empty(g.sizes(), g.options().dtype(torch::kBFloat16));
    const float* gp = g.const_data_ptr<float>();
    auto* d = reinterpret_cast<uint16_t*>(db.data_ptr());
    const int64_t n = g.numel();
    at::parallel_for(0, (n + 1) / 2, 1 << 13, [&](int64_t begin, int64_t end) {
      const int64_t full = std::min(end, n / 2);
      if (begin < full) grad_mask_pairs_bf16(gp, d, begin, full, seed, threshold, scale, keep_all);
      if (end > full && n % 2 == 1) {
        using c10::detail::f32_from_bits, c10::detail::round_to_nearest_even;
        const int64_t i = n - 1;
        const bool keep = keep_all || pair_bits(seed, i / 2).even >= threshold;
        const uint16_t gb = round_to_nearest_even(gp[i]);
        d[i] = !keep     ? uint16_t{0}
               : keep_all ? gb
                          : round_to_nearest_even(f32_from_bits(gb) * scale);
      }
    });
    return {grads[0], db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// dropout(softmax(scores, -1)) for bf16 scores, contiguous, with an even last dimension, on the
// CPU: the forward is LibTorch's softmax and apply_mask (the same values), the backward one pass
// (softmax_dropout_grad_rows). Saves the softmax output, as the softmax alone does.
struct SoftmaxDropoutFunction : public torch::autograd::Function<SoftmaxDropoutFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& scores,
                               int64_t seed, int64_t threshold, double scale) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const torch::Tensor y = at::_softmax(scores, -1, /*half_to_float=*/false);
    ctx->save_for_backward({y});
    save_mask(ctx, seed, threshold, scale);
    return apply_mask(y, static_cast<uint64_t>(seed), static_cast<uint32_t>(threshold),
                      static_cast<float>(scale));
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor y = ctx->get_saved_variables()[0].contiguous();
    const torch::Tensor g = grads[0].to(torch::kBFloat16).contiguous();
    torch::Tensor out = torch::empty_like(y, at::MemoryFormat::Contiguous);
    const int64_t keys = y.size(-1), rows = keys == 0 ? 0 : y.numel() / keys;
    const auto [seed, threshold, scale] = saved_mask(ctx);
    const auto* gp = reinterpret_cast<const uint16_t*>(g.const_data_ptr());
    const auto* yp = reinterpret_cast<const uint16_t*>(y.const_data_ptr());
    auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(keys, 1)),
                     [&](int64_t begin, int64_t end) {
                       std::vector<float> gy(static_cast<size_t>(keys));
                       softmax_dropout_grad_rows(gp, yp, op, begin, end, keys, seed, threshold,
                                                 scale, gy.data());
                     });
    return {out, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

DropoutDraw draw_dropout(double p) {
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("dropout: p must be in [0, 1), got {}", p));
  uint64_t seed = 0;  // one draw from the default CPU generator per dropout call
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    seed = gen.get<at::CPUGeneratorImpl>()->random64();
  }
  // An element is kept when its 24 bits are >= the threshold round(p * 2^24).
  return {seed, static_cast<uint32_t>(std::llround(p * static_cast<double>(1u << 24))),
          static_cast<float>(1.0 / (1.0 - p))};
}

namespace cpu {

torch::Tensor dropout(const torch::Tensor& x, const DropoutDraw& draw) {
  return DropoutFunction::apply(x, static_cast<int64_t>(draw.seed), draw.threshold, draw.scale);
}

bool dropout_add_applies(const torch::Tensor& residual, const torch::Tensor& branch) {
  return residual.is_cpu() && branch.is_cpu() && residual.scalar_type() == torch::kFloat &&
         branch.scalar_type() == torch::kBFloat16 && residual.sizes() == branch.sizes() &&
         residual.is_contiguous() && branch.is_contiguous();
}

torch::Tensor dropout_add(const torch::Tensor& residual, const torch::Tensor& branch,
                          const DropoutDraw* draw) {
  if (draw == nullptr)  // every element kept, no draw (as dropout)
    return DropoutAddFunction::apply(residual, branch, 0, 0, 1.0);
  return DropoutAddFunction::apply(residual, branch, static_cast<int64_t>(draw->seed),
                                   draw->threshold, draw->scale);
}

bool softmax_dropout_applies(const torch::Tensor& scores) {
  return scores.is_cpu() && scores.scalar_type() == torch::kBFloat16 && scores.dim() >= 1 &&
         scores.size(-1) % 2 == 0 && scores.is_contiguous();
}

torch::Tensor softmax_dropout(const torch::Tensor& scores, const DropoutDraw& draw) {
  return SoftmaxDropoutFunction::apply(scores, static_cast<int64_t>(draw.seed), draw.threshold,
                                       draw.scale);
}

}  // namespace cpu
}  // namespace mllm
