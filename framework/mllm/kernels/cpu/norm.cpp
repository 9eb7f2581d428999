// LayerNorm with the residual step, and RMSNorm, as one pass per row (kernels/cpu/norm.h).
#include "mllm/kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/dropout.h"
#include "mllm/kernels/cpu/vec16.h"

namespace mllm {
namespace {

using namespace vec16;  // NOLINT(build/namespaces): the 16-lane helpers of the row passes

// The row block whose weight and bias gradients are summed in one partial (norm.h).
constexpr int64_t kBlockRows = 32;

[[gnu::always_inline]] inline float lane_sum(Floats v) {
  float s = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// The dropped branch of 16 elements starting at element i (even) of the call's contiguous
// tensor: branch * (keep ? scale : 0), mllm::dropout's mask (mask_pairs_f32's product, so the
// same bits); the branch itself when keep_all (evaluation, p == 0).
[[gnu::always_inline]] inline Floats dropped(const float* b, int64_t i, uint64_t seed,
                                            uint32_t threshold, float scale, bool keep_all) {
  const Floats v = load<Floats>(b);
  if (keep_all) return v;
  return v * (keep16(seed, i / 2, threshold) ? splat(scale) : Floats{});
}

// Rows r0..r1-1 of the forward pass over [rows, d] (d a multiple of 16): s = res + dropped(br)
// into s (row stride s_ld: d, or 0 for one row of scratch), the row's mean and rstd (into mean
// and rstd when not null), y = (s - mean) * rstd * w + b. Without multiply-add contraction
// (here and in add_norm_rows): s must be LibTorch's res + round(branch * scale), two roundings,
// not one fused multiply-add; so every code path gives the same bits.
[[gnu::always_inline, gnu::optimize("fp-contract=off")]] inline void add_norm_rows_impl(
    const float* __restrict res, const float* __restrict br, const float* __restrict w,
    const float* __restrict b, int64_t r0, int64_t r1, int64_t d, float eps, uint64_t seed,
    uint32_t threshold, float scale, bool keep_all, float* __restrict s, int64_t s_ld,
    float* __restrict y, float* __restrict mean, float* __restrict rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = r0; r < r1; ++r) {
    const float* rr = res + r * d;
    const float* bb = br + r * d;
    float* ss = s + r * s_ld;
    float* yy = y + r * d;
    Floats acc = {};
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats v = load<Floats>(rr + c) + dropped(bb + c, r * d + c, seed, threshold, scale,
                                                      keep_all);
      store(ss + c, v);
      acc += v;
    }
    const float m = lane_sum(acc) * inv_d;
    Floats sq = {};
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats dv = load<Floats>(ss + c) - m;
      sq += dv * dv;
    }
    const float rs = 1.0f / std::sqrt(lane_sum(sq) * inv_d + eps);
    for (int64_t c = 0; c < d; c += kLanes)
      store(yy + c, (load<Floats>(ss + c) - m) * rs * load<Floats>(w + c) + load<Floats>(b + c));
    if (mean != nullptr) mean[r] = m;
    if (rstd != nullptr) rstd[r] = rs;
  }
}

// Rows r0..r1-1 of the backward pass from g = dL/dy [rows, d] and the forward's s, mean, rstd:
// ds = rstd (g w - mean(g w) - xhat mean(g w xhat)) into dres (when not null) and ds * keep *
// scale into dbr (when not null); with dw and db not null, g * xhat and g summed over the rows
// into them (in row order).
[[gnu::always_inline]] inline void add_norm_grad_rows_impl(
    const float* __restrict g, const float* __restrict s, const float* __restrict mean,
    const float* __restrict rstd, const float* __restrict w, int64_t r0, int64_t r1, int64_t d,
    uint64_t seed, uint32_t threshold, float scale, bool keep_all, float* __restrict dres,
    float* __restrict dbr, float* __restrict dw, float* __restrict db) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gg = g + r * d;
    const float* ss = s + r * d;
    const float m = mean[r], rs = rstd[r];
    Floats acc1 = {}, acc2 = {};
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats gv = load<Floats>(gg + c);
      const Floats xhat = (load<Floats>(ss + c) - m) * rs;
      const Floats gw = gv * load<Floats>(w + c);
      acc1 += gw;
      acc2 += gw * xhat;
      if (dw != nullptr) {
        store(dw + c, load<Floats>(dw + c) + gv * xhat);
        store(db + c, load<Floats>(db + c) + gv);
      }
    }
    const float c1 = lane_sum(acc1) * inv_d, c2 = lane_sum(acc2) * inv_d;
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats xhat = (load<Floats>(ss + c) - m) * rs;
      const Floats ds = (load<Floats>(gg + c) * load<Floats>(w + c) - c1 - xhat * c2) * rs;
      if (dres != nullptr) store(dres + r * d + c, ds);
      if (dbr != nullptr) {
        const Floats k = keep_all ? splat(1.0f)
                                  : (keep16(seed, (r * d + c) / 2, threshold) ? splat(scale)
                                                                             : Floats{});
        store(dbr + r * d + c, ds * k);
      }
    }
  }
}

// RMSNorm's rows r0..r1-1 of x [rows, d]: rstd = 1 / sqrt(mean(x^2) + eps) (into rstd when not
// null), y = (x * rstd) * w.
[[gnu::always_inline]] inline void rms_rows_impl(const float* __restrict x,
                                                 const float* __restrict w, int64_t r0,
                                                 int64_t r1, int64_t d, float eps,
                                                 float* __restrict y, float* __restrict rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xx = x + r * d;
    Floats sq = {};
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats v = load<Floats>(xx + c);
      sq += v * v;
    }
    const float rs = 1.0f / std::sqrt(lane_sum(sq) * inv_d + eps);
    for (int64_t c = 0; c < d; c += kLanes)
      store(y + r * d + c, load<Floats>(xx + c) * rs * load<Floats>(w + c));
    if (rstd != nullptr) rstd[r] = rs;
  }
}

// Its backward for rows r0..r1-1 from g = dL/dy: dx = (g w - xhat mean(g w xhat)) * rstd into dx
// (when not null); with dw not null, g * xhat summed over the rows into it (in row order).
[[gnu::always_inline]] inline void rms_grad_rows_impl(
    const float* __restrict g, const float* __restrict x, const float* __restrict rstd,
    const float* __restrict w, int64_t r0, int64_t r1, int64_t d, float* __restrict dx,
    float* __restrict dw) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gg = g + r * d;
    const float* xx = x + r * d;
    const float rs = rstd[r];
    Floats acc = {};
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats gv = load<Floats>(gg + c);
      const Floats xhat = load<Floats>(xx + c) * rs;
      acc += gv * load<Floats>(w + c) * xhat;
      if (dw != nullptr) store(dw + c, load<Floats>(dw + c) + gv * xhat);
    }
    if (dx == nullptr) continue;
    const float c1 = lane_sum(acc) * inv_d;
    for (int64_t c = 0; c < d; c += kLanes) {
      const Floats xhat = load<Floats>(xx + c) * rs;
      store(dx + r * d + c, (load<Floats>(gg + c) * load<Floats>(w + c) - xhat * c1) * rs);
    }
  }
}

// Compiled three times (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA, baseline; chosen when the
// library loads): the v3 and v4 versions contract multiply-adds alike, so they give the same
// bits; the baseline version (no FMA) may differ in the last bit.
#if defined(__x86_64__) && defined(__GNUC__)
#define MLLM_ROW_PASS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLLM_ROW_PASS
#endif
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((optimize("fp-contract=off")))
#endif
MLLM_ROW_PASS void add_norm_rows(const float* res, const float* br, const float* w,
                                 const float* b, int64_t r0, int64_t r1, int64_t d, float eps,
                                 uint64_t seed, uint32_t threshold, float scale, bool keep_all,
                                 float* s, int64_t s_ld, float* y, float* mean, float* rstd) {
  add_norm_rows_impl(res, br, w, b, r0, r1, d, eps, seed, threshold, scale, keep_all, s, s_ld, y,
                     mean, rstd);
}
MLLM_ROW_PASS void add_norm_grad_rows(const float* g, const float* s, const float* mean,
                                      const float* rstd, const float* w, int64_t r0, int64_t r1,
                                      int64_t d, uint64_t seed, uint32_t threshold, float scale,
                                      bool keep_all, float* dres, float* dbr, float* dw,
                                      float* db) {
  add_norm_grad_rows_impl(g, s, mean, rstd, w, r0, r1, d, seed, threshold, scale, keep_all, dres,
                          dbr, dw, db);
}
MLLM_ROW_PASS void rms_rows(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d,
                            float eps, float* y, float* rstd) {
  rms_rows_impl(x, w, r0, r1, d, eps, y, rstd);
}
MLLM_ROW_PASS void rms_grad_rows(const float* g, const float* x, const float* rstd,
                                 const float* w, int64_t r0, int64_t r1, int64_t d, float* dx,
                                 float* dw) {
  rms_grad_rows_impl(g, x, rstd, w, r0, r1, d, dx, dw);
}
#undef MLLM_ROW_PASS

// Rows split for the forward pass: every row is independent, so any split gives the same bits.
int64_t row_grain(int64_t d) { return std::max<int64_t>(1, (int64_t{1} << 14) / d); }

// A weight (or bias) gradient [d] from the row blocks' partial sums: part + k * stride for block
// k, added in block order (a plain loop: a fixed order, whatever the thread count).
torch::Tensor sum_blocks(const torch::Tensor& part, int64_t blocks, int64_t stride, int64_t d) {
  torch::Tensor out = torch::zeros({d}, part.options());
  float* o = out.data_ptr<float>();
  const float* pp = part.const_data_ptr<float>();
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t c = 0; c < d; ++c) o[c] += pp[k * stride + c];
  return out;
}

// A dropout call's mask: the seed, the 24-bit drop threshold and the scale (dropout.h's
// DropoutDraw); threshold 0 and scale 1 keep every element (no draw: evaluation or p == 0).
struct Mask {
  uint64_t seed = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
  bool keep_all() const { return threshold == 0 && scale == 1.0f; }
};

// y only (no statistics kept): outside grad mode, or with nothing requiring grad.
torch::Tensor forward_only(const torch::Tensor& res, const torch::Tensor& br,
                           const torch::Tensor& w, const torch::Tensor& b, double eps,
                           const Mask& m) {
  const int64_t d = res.size(-1), rows = res.numel() / d;
  torch::Tensor y = torch::empty_like(res, at::MemoryFormat::Contiguous);
  const float* rp = res.const_data_ptr<float>();
  const float* bp = br.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    std::vector<float> s(static_cast<size_t>(d));  // one row of the sum, reused
    // add_norm_rows indexes s by r * s_ld: with s_ld = 0 every row uses the scratch row.
    add_norm_rows(rp, bp, w.const_data_ptr<float>(), b.const_data_ptr<float>(), r0, r1, d,
                  static_cast<float>(eps), m.seed, m.threshold, m.scale, m.keep_all(), s.data(),
                  0, yp, nullptr, nullptr);
  });
  return y;
}

struct DropoutAddLayerNormFunction
    : public torch::autograd::Function<DropoutAddLayerNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& res,
                               const torch::Tensor& br, const torch::Tensor& w,
                               const torch::Tensor& b, int64_t seed, int64_t threshold,
                               double scale, double eps) {
    const int64_t d = res.size(-1), rows = res.numel() / d;
    const Mask m{static_cast<uint64_t>(seed), static_cast<uint32_t>(threshold),
                 static_cast<float>(scale)};
    torch::Tensor y = torch::empty_like(res, at::MemoryFormat::Contiguous);
    torch::Tensor s = torch::empty({rows, d}, res.options());
    torch::Tensor mean = torch::empty({rows}, res.options());
    torch::Tensor rstd = torch::empty({rows}, res.options());
    const float* rp = res.const_data_ptr<float>();
    const float* bp = br.const_data_ptr<float>();
    at::parallel_for(0, rows, row_grain(d), [&](int64_t r0, int64_t r1) {
      add_norm_rows(rp, bp, w.const_data_ptr<float>(), b.const_data_ptr<float>(), r0, r1, d,
                    static_cast<float>(eps), m.seed, m.threshold, m.scale, m.keep_all(),
                    s.data_ptr<float>(), d, y.data_ptr<float>(), mean.data_ptr<float>(),
                    rstd.data_ptr<float>());
    });
    // s is this Function's own buffer, never returned: no in-place change can reach it.
    ctx->save_for_backward({s, mean, rstd, w});
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["threshold"] = threshold;
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &s = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3];
    const Mask m{static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                 static_cast<uint32_t>(ctx->saved_data["threshold"].toInt()),
                 static_cast<float>(ctx->saved_data["scale"].toDouble())};
    const torch::Tensor g = grads[0].to(torch::kFloat).contiguous();
    const int64_t rows = s.size(0), d = s.size(1);
    const bool want_res = ctx->needs_input_grad(0), want_br = ctx->needs_input_grad(1);
    const bool want_params = ctx->needs_input_grad(2) || ctx->needs_input_grad(3);
    torch::Tensor dres, dbr, part;
    if (want_res) dres = torch::empty(g.sizes(), g.options());
    if (want_br) dbr = torch::empty(g.sizes(), g.options());
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    // Per block: [d] sums of g * xhat, then [d] sums of g.
    if (want_params) part = torch::zeros({blocks, 2, d}, g.options());
    at::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        float* pk = want_params ? part.data_ptr<float>() + k * 2 * d : nullptr;
        add_norm_grad_rows(g.const_data_ptr<float>(), s.const_data_ptr<float>(),
                           mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                           w.const_data_ptr<float>(), k * kBlockRows,
                           std::min(rows, (k + 1) * kBlockRows), d, m.seed, m.threshold,
                           m.scale, m.keep_all(), want_res ? dres.data_ptr<float>() : nullptr,
                           want_br ? dbr.data_ptr<float>() : nullptr, pk,
                           pk != nullptr ? pk + d : nullptr);
      }
    });
    torch::Tensor dw, db;
    if (ctx->needs_input_grad(2)) dw = sum_blocks(part, blocks, 2 * d, d);
    if (ctx->needs_input_grad(3)) db = sum_blocks(part.narrow(1, 1, 1), blocks, 2 * d, d);
    return {dres, dbr, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// RMSNorm's output for contiguous x [..., d], and its rstd [rows] into `rstd` when defined.
torch::Tensor rms_forward(const torch::Tensor& x, const torch::Tensor& w, double eps,
                          const torch::Tensor& rstd) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  torch::Tensor y = torch::empty_like(x, at::MemoryFormat::Contiguous);
  at::parallel_for(0, rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    rms_rows(x.const_data_ptr<float>(), w.const_data_ptr<float>(), r0, r1, d,
             static_cast<float>(eps), y.data_ptr<float>(),
             rstd.defined() ? rstd.data_ptr<float>() : nullptr);
  });
  return y;
}

// RMSNorm's forward and backward (rms_norm in norm.h).
struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, double eps) {
    const torch::Tensor rstd = torch::empty({x.numel() / x.size(-1)}, x.options());
    torch::Tensor y = rms_forward(x, w, eps, rstd);
    ctx->save_for_backward({x, rstd, w});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &rstd = saved[1], &w = saved[2];
    const torch::Tensor g = grads[0].to(torch::kFloat).contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    torch::Tensor dx, dw, part;
    if (want_x) dx = torch::empty(x.sizes(), g.options());
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    if (want_w) part = torch::zeros({blocks, d}, g.options());
    at::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k)
        rms_grad_rows(g.const_data_ptr<float>(), x.const_data_ptr<float>(),
                      rstd.const_data_ptr<float>(), w.const_data_ptr<float>(), k * kBlockRows,
                      std::min(rows, (k + 1) * kBlockRows), d,
                      want_x ? dx.data_ptr<float>() : nullptr,
                      want_w ? part.data_ptr<float>() + k * d : nullptr);
    });
    if (want_w) dw = sum_blocks(part, blocks, d, d);
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace

namespace cpu {

bool add_layer_norm_applies(const torch::Tensor& res, const torch::Tensor& br,
                            const torch::Tensor& w, const torch::Tensor& b) {
  const auto f32_cpu = [](const torch::Tensor& t) {
    return t.defined() && t.is_cpu() && t.scalar_type() == torch::kFloat && !t.is_sparse();
  };
  if (!f32_cpu(res) || !f32_cpu(br) || !f32_cpu(w) || !f32_cpu(b)) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  if (res.dim() < 1 || res.sizes() != br.sizes()) return false;
  const int64_t d = res.size(-1);
  return d > 0 && d % kLanes == 0 && w.dim() == 1 && w.size(0) == d && b.dim() == 1 &&
         b.size(0) == d;
}

torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     double p, bool training, const torch::Tensor& weight,
                                     const torch::Tensor& bias, double eps) {
  Mask m;
  if (training && p > 0.0) {  // one draw, as dropout_add takes
    const DropoutDraw draw = draw_dropout(p);
    m = {draw.seed, draw.threshold, draw.scale};
  }
  const torch::Tensor res = residual.contiguous(), br = branch.contiguous();
  const torch::Tensor w = weight.contiguous(), b = bias.contiguous();
  const bool records = torch::GradMode::is_enabled() &&
                       (res.requires_grad() || br.requires_grad() || w.requires_grad() ||
                        b.requires_grad());
  if (!records) return forward_only(res, br, w, b, eps, m);
  return DropoutAddLayerNormFunction::apply(res, br, w, b, static_cast<int64_t>(m.seed),
                                            static_cast<int64_t>(m.threshold),
                                            static_cast<double>(m.scale), eps);
}

bool rms_norm_applies(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.is_cpu() && weight.is_cpu() && x.scalar_type() == torch::kFloat &&
         weight.scalar_type() == torch::kFloat && !x.is_sparse() && x.size(-1) % kLanes == 0 &&
         x.size(-1) > 0;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor xc = x.contiguous(), w = weight.contiguous();
  if (torch::GradMode::is_enabled() && (xc.requires_grad() || w.requires_grad()))
    return RmsNormFunction::apply(xc, w, eps);
  return rms_forward(xc, w, eps, torch::Tensor());
}

}  // namespace cpu
}  // namespace mllm
