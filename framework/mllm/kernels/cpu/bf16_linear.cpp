// The CPU bf16 autocast linear with a float32 weight gradient from oneMKL (bf16_linear.h).
#include "mllm/kernels/cpu/bf16_linear.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/BFloat16.h>
#include <c10/util/accumulate.h>
#include <c10/util/bit_cast.h>
#include <fmt/format.h>

#include "mllm/core/blas.h"
#include "mllm/core/error.h"
#include "mllm/kernels/cpu/f32_linear.h"
#include "mllm/kernels/cpu/mkl_gemm.h"
#include "mllm/kernels/cpu/vec16.h"

namespace mllm {
namespace {

// The measured bf16 GEMM rate below which choose_bf16_gemm takes the float32 sgemm on widened
// operands (a fraction of the fp32 rate): the widening costs 5-10% of a product, and a margin
// keeps two runs on one machine from choosing differently on timing noise.
constexpr double kSgemmBelowRatio = 0.8;
// On a CPU with avx512_bf16 and no AMX whose bf16 GEMM is not slow, the fraction of ATen's bf16
// GEMM rate from which oneMKL's is taken: its path (fused attention, float32 gradients without
// casts) spent ~400 ms less per small-shape step outside the linear layers' products than
// ATen's on a Xeon whose two bf16 GEMMs ran at one rate (bench/README.md), so a product up to
// ~10% slower still leaves the step faster.
constexpr double kMklFromRatio = 0.9;

struct GemmChoice {
  Bf16GemmPath path = Bf16GemmPath::kAten;
  GemmBf16Bf16F32 gemm = nullptr;
  std::string why;  // for the log: which path, and why
};

// Decides from MLLM_BF16_GEMM, the CPU and (when measured: both > 0) the GEMM rates, then looks
// the functions up.
GemmChoice decide_gemm(double bf16_flops, double fp32_flops, double mkl_bf16_flops) {
  if (std::getenv("MLLM_BF16_WEIGHT_GRAD") != nullptr)
    throw ConfigError("MLLM_BF16_WEIGHT_GRAD was renamed MLLM_BF16_GEMM (mkl, sgemm or aten; "
                      "docs/precision.md): unset it");
  const char* env = std::getenv("MLLM_BF16_GEMM");
  const std::string value = env != nullptr ? env : "";
  const CpuIsa isa = detect_cpu_isa();
  const Bf16GemmPath want =
      wanted_bf16_gemm_path(value, isa.amx_bf16, isa.avx512_bf16, bf16_flops, fp32_flops,
                            mkl_bf16_flops);
  const bool measured = bf16_flops > 0 && fp32_flops > 0;
  const std::string ratio =
      measured ? fmt::format("the measured bf16 GEMM ran at {:.2f} of the fp32 one",
                             bf16_flops / fp32_flops)
               : "";
  const std::string mkl_ratio =
      measured && mkl_bf16_flops > 0
          ? fmt::format("oneMKL's bf16 GEMM ran at {:.2f} of ATen's", mkl_bf16_flops / bf16_flops)
          : "";
  GemmChoice c;
  switch (want) {
    case Bf16GemmPath::kSgemm:
      c.why = value == "sgemm" ? "MLLM_BF16_GEMM=sgemm" : ratio;
      if (!mkl_sgemm_available()) {
        c.why = "libtorch_cpu.so exports no sgemm_ for the float32 path (" + c.why + ")";
        return c;
      }
      c.path = Bf16GemmPath::kSgemm;
      c.gemm = &sgemm_on_widened_bf16;
      return c;
    case Bf16GemmPath::kMkl: {
      c.gemm = mkl_gemm_bf16bf16f32();
      if (c.gemm == nullptr) {
        c.why = "LibTorch's libtorch_cpu.so exports no cblas_gemm_bf16bf16f32";
        return c;
      }
      c.path = Bf16GemmPath::kMkl;
      c.why = value == "mkl"   ? "MLLM_BF16_GEMM=mkl"
              : isa.amx_bf16   ? "this CPU has AMX-BF16"
                               : ratio + " and " + mkl_ratio + " (avx512_bf16, no AMX)";
      return c;
    }
    case Bf16GemmPath::kAten:
      break;
  }
  if (value == "aten")
    c.why = "MLLM_BF16_GEMM=aten";
  else if (value == "mkl")
    c.why = "MLLM_BF16_GEMM=mkl, but this CPU has no bf16 units";
  else if (measured && !isa.avx512_bf16)
    c.why = ratio + ", and this CPU has no avx512_bf16 or AMX-BF16";
  else if (measured && !mkl_ratio.empty())
    c.why = ratio + ", and " + mkl_ratio + " (below " + fmt::format("{}", kMklFromRatio) +
            "; MLLM_BF16_GEMM=mkl takes it anyway)";
  else if (measured)
    c.why = ratio + ", and oneMKL's bf16 GEMM was not timed (the symbol is missing, or the "
                    "job's CPUs differ; MLLM_BF16_GEMM=mkl takes it)";
  else
    c.why = "no AMX, and no measured GEMM rates (MLLM_BF16_GEMM=mkl or sgemm chooses)";
  return c;
}

std::mutex gemm_choice_mutex;
std::optional<GemmChoice> gemm_choice_made;

const GemmChoice& gemm_choice(double bf16_flops = 0, double fp32_flops = 0,
                              double mkl_bf16_flops = 0) {
  std::lock_guard<std::mutex> lock(gemm_choice_mutex);
  if (!gemm_choice_made) gemm_choice_made = decide_gemm(bf16_flops, fp32_flops, mkl_bf16_flops);
  return *gemm_choice_made;
}

GemmBf16Bf16F32 own_gemm() { return gemm_choice().gemm; }
bool sgemm_path() { return gemm_choice().path == Bf16GemmPath::kSgemm; }

// dst [rows, cols] float32 (contiguous) = the bf16 values src [rows, cols] (leading dimension
// ld), exactly: a bf16 pattern is the upper half of the float32 one.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void widen_rows(const uint16_t* __restrict src, int64_t rows, int64_t cols, int64_t ld,
                float* __restrict dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      dst[r * cols + j] = c10::bit_cast<float>(static_cast<uint32_t>(src[r * ld + j]) << 16);
}

void widen(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  // Rows per task: ~64 K elements, so that a small operand stays on one thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    widen_rows(src + r0 * ld, r1 - r0, cols, ld, dst + r0 * cols);
  });
}

// t [...] bf16 CPU -> the same values as a contiguous float32 tensor of t's shape (widen; not
// ATen's cast, whose _to_copy would read as one more bf16 cast of a weight to the profiler).
torch::Tensor widened(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  torch::Tensor out = torch::empty(c.sizes(), c.options().dtype(torch::kFloat));
  const int64_t cols = c.dim() == 0 ? 1 : c.size(-1);
  const int64_t rows = cols == 0 ? 0 : c.numel() / cols;
  widen(reinterpret_cast<const uint16_t*>(c.const_data_ptr()), rows, cols, cols,
        out.data_ptr<float>());
  return out;
}

// out [rows, cols] bf16 = round(y + bias), or round(max(0, y + bias)) with `relu` (torch::relu:
// a NaN stays NaN), for y [rows, cols] float32 and bias [cols] float32 or nullptr: the bias and
// the ReLU on the float32 accumulator, then one rounding to nearest even (c10's, NaN -> 0x7FC0),
// as oneDNN's fused linear does. Rounding is monotone and keeps 0, so round(max(0, v)) is
// max(0, round(v)): the values autocast's linear and torch::relu give.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void bias_relu_round_rows(const float* __restrict y, const float* __restrict bias, bool relu,
                          int64_t rows, int64_t cols, uint16_t* __restrict out) {
  using namespace vec16;  // NOLINT(build/namespaces)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    uint16_t* o = out + r * cols;
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      Floats v = load<Floats>(yr + j);
      if (bias != nullptr) v = v + load<Floats>(bias + j);
      if (relu) v = v < 0.0f ? splat(0.0f) : v;
      store(o + j, to_bf16(v));
    }
    for (; j < cols; ++j) {
      float v = yr[j] + (bias != nullptr ? bias[j] : 0.0f);
      if (relu && v < 0.0f) v = 0.0f;
      o[j] = c10::detail::round_to_nearest_even(v);
    }
  }
}

// x16 [..., in] bf16, w16 [out, in] bf16, b16 [out] bf16 or none -> [..., out] bf16 (a plain
// tensor): the kSgemm path's forward, float32 sgemm on the widened operands, then
// bias_relu_round_rows.
torch::Tensor forward_widened(const torch::Tensor& x16, const torch::Tensor& w16,
                              const std::optional<torch::Tensor>& b16, bool relu) {
  const int64_t in = w16.size(1), out = w16.size(0);
  const int64_t rows = c10::multiply_integers(x16.sizes().begin(), x16.sizes().end() - 1);
  std::vector<int64_t> y_shape(x16.sizes().begin(), x16.sizes().end());
  y_shape.back() = out;
  const torch::Tensor y32 = at::mm(widened(x16.reshape({rows, in})), widened(w16).t());
  const torch::Tensor b32 = b16.has_value() ? widened(*b16) : torch::Tensor();
  torch::Tensor y = torch::empty(y_shape, x16.options());
  const float* yp = y32.const_data_ptr<float>();
  const float* bp = b32.defined() ? b32.const_data_ptr<float>() : nullptr;
  auto* op = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(out, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    bias_relu_round_rows(yp + r0 * out, bp, relu, r1 - r0, out, op + r0 * out);
  });
  return y;
}

// ReLU's gradient on bf16 bit patterns: out = y <= 0 ? 0 : g (PyTorch's threshold_backward
// with threshold 0, so a NaN output passes the gradient), for y = relu(.) and its gradient g.
// y <= 0 for +-0 and for a set sign bit with a non-NaN magnitude. One pass over 16-bit integers
// (ATen's kernel widens both operands to float32 and rounds back).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void relu_grad_bits(const uint16_t* __restrict g, const uint16_t* __restrict y,
                    uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t magnitude = y[i] & 0x7FFFu;
    const bool at_most_zero = magnitude == 0 || ((y[i] & 0x8000u) != 0 && magnitude <= 0x7F80u);
    out[i] = at_most_zero ? uint16_t{0} : g[i];
  }
}

// oneDNN's fused linear, mkldnn::_linear_pointwise(X, W, B, attr, scalars, algorithm): one inner
// product with the bias (and, with attr "relu", the ReLU) applied to the float32 accumulator
// before the single rounding to bf16 (what the Inductor CPU backend calls for a linear and its
// pointwise successor). ATen's addmm instead first copies the broadcast bias into the whole
// [rows, out] output and reads it back in the GEMM, and a separate ReLU reads and writes the
// output once more. Used where the CPU has bf16 units (the op's bf16 kernel needs AVX-512) and
// LibTorch registers the op; nullptr otherwise.
const c10::OperatorHandle* fused_linear_op() {
  static const std::optional<c10::OperatorHandle> op = []() -> std::optional<c10::OperatorHandle> {
    const CpuIsa isa = detect_cpu_isa();
    if (!at::hasMKLDNN() || !(isa.avx512_bf16 || isa.amx_bf16)) return std::nullopt;
    return c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  }();
  return op.has_value() ? &*op : nullptr;
}

// x16 [..., in] bf16, w16 [out, in] bf16, b16 [out] bf16 or none -> [..., out] bf16, a plain
// (non-view) tensor: x16 @ w16^T + b16, then max(0, .) when `relu`.
torch::Tensor forward_bf16(const torch::Tensor& x16, const torch::Tensor& w16,
                           const std::optional<torch::Tensor>& b16, bool relu) {
  if (sgemm_path()) return forward_widened(x16, w16, b16, relu);
  torch::Tensor y;
  const c10::OperatorHandle* op = fused_linear_op();
  if (op != nullptr && (b16.has_value() || relu)) {
    std::vector<c10::IValue> stack{x16,
                                   w16,
                                   b16.has_value() ? c10::IValue(*b16) : c10::IValue(),
                                   c10::IValue(std::string(relu ? "relu" : "none")),
                                   c10::IValue(c10::List<std::optional<at::Scalar>>()),
                                   c10::IValue()};
    op->callBoxed(stack);
    y = stack[0].toTensor();
  } else {
    // Without a bias ATen's linear is one mm: nothing to fuse.
    y = at::linear(x16, w16, b16);
    if (relu) y = at::relu(y);
  }
  // Both return a view of the 2-D product for a 3-D input; a view made inside a custom Function
  // could not be modified in place, so the output is a plain tensor over the same storage.
  return y.is_view() ? at::_unsafe_view(y, y.sizes()) : y;
}

// dx [rows, in] float32 = g [rows, out] bf16 @ w16 [out, in] bf16 through oneMKL's
// cblas_gemm_bf16bf16f32 (accumulated and returned in float32, not rounded to bf16), or an
// undefined tensor where that GEMM is not in use, a tensor is not on the CPU or a size exceeds
// its int (the caller then takes ATen's path). As weight_grad_float32, contiguous operands are
// not copied.
torch::Tensor input_grad_float32(const torch::Tensor& g, const torch::Tensor& w16) {
  const GemmBf16Bf16F32 gemm = own_gemm();
  const int64_t rows = g.size(0), out = g.size(1), in = w16.size(1);
  if (gemm == nullptr || !g.is_cpu() || !w16.is_cpu() || rows > INT_MAX || out > INT_MAX ||
      in > INT_MAX)
    return {};
  const torch::Tensor gc = g.contiguous(), wc = w16.contiguous();
  torch::Tensor dx = torch::empty({rows, in}, g.options().dtype(torch::kFloat));
  if (rows == 0 || out == 0 || in == 0) return dx.zero_();
  RECORD_FUNCTION("mkl::cblas_gemm_bf16bf16f32", std::vector<c10::IValue>({gc, wc}));
  gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kNoTrans, static_cast<int>(rows),
       static_cast<int>(in), static_cast<int>(out), 1.0f, gc.const_data_ptr(),
       static_cast<int>(out), wc.const_data_ptr(), static_cast<int>(in), 0.0f,
       dx.data_ptr<float>(), static_cast<int>(in));
  return dx;
}

// The gradients of y = x16 @ w16^T (+ b) from g [rows, out] bf16, each only when asked for:
// dx [x16's shape] in x_dtype (for a float32 x, input_grad_float32 where oneMKL's bf16 GEMM is
// in use: a float32 product, no bf16 rounding and no cast; else ATen's bf16 mm, cast),
// dw [out, in] float32 (weight_grad_float32), db [out] float32 (bias_grad_float32). Undefined
// when not asked for.
struct LinearGrads {
  torch::Tensor dx, dw, db;
};
LinearGrads linear_grads(const torch::Tensor& g, const torch::Tensor& x16, const torch::Tensor& w16,
                         torch::ScalarType x_dtype, bool need_dx, bool need_dw, bool need_db) {
  LinearGrads r;
  if (sgemm_path()) {
    // Float32 products whatever autocast state the backward runs under; g widened once for the
    // three; dx for a bf16 x rounded to bf16 once.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const torch::Tensor g32 = widened(g);
    if (need_dx) r.dx = at::mm(g32, widened(w16)).view(x16.sizes()).to(x_dtype);
    if (need_dw) r.dw = at::mm(g32.t(), widened(x16.reshape({g.size(0), w16.size(1)})));
    if (need_db) r.db = g32.sum(0);
    return r;
  }
  if (need_dx) {
    const torch::Tensor dx =
        x_dtype == torch::kFloat ? input_grad_float32(g, w16) : torch::Tensor();
    r.dx = dx.defined() ? dx.view(x16.sizes()) : at::mm(g, w16).view(x16.sizes()).to(x_dtype);
  }
  if (need_dw) r.dw = weight_grad_float32(g, x16.reshape({g.size(0), w16.size(1)}).contiguous());
  if (need_db) r.db = bias_grad_float32(g);
  return r;
}

class Bf16Linear : public torch::autograd::Function<Bf16Linear> {
 public:
  // w16, b16: the bf16 copies of weight and bias, detached (their gradients go to weight and
  // bias directly, in float32). relu: the output is max(0, x W^T + b).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias, const torch::Tensor& w16,
                               const std::optional<torch::Tensor>& b16, bool relu) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    torch::Tensor x16 = x.scalar_type() == torch::kBFloat16 ? x : x.to(torch::kBFloat16);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["relu"] = relu;
    // The values of autocast's linear on the same bf16 operands (one addmm or mm over the folded
    // leading dimensions; oneDNN's fused op gives the same bits: the float32 accumulator plus
    // the bias, rounded once; Linear.Bf16AutocastForwardEqualsAutocastsLinear).
    torch::Tensor y = forward_bf16(x16, w16, b16, relu);
    // With ReLU the backward needs the output (ReLU's own backward keeps it too).
    ctx->save_for_backward(relu ? torch::autograd::variable_list{x16, w16, y}
                                : torch::autograd::variable_list{x16, w16});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x16 = saved[0];
    const torch::Tensor& w16 = saved[1];
    // Rows: the product of the leading dimensions (explicit, so that a zero-size dimension
    // cannot leave a -1 unresolved).
    const int64_t rows = c10::multiply_integers(x16.sizes().begin(), x16.sizes().end() - 1);
    torch::Tensor g = grad_out[0].to(torch::kBFloat16);
    // ReLU's gradient: zero where the output is 0 (PyTorch's relu backward, threshold 0).
    if (ctx->saved_data["relu"].toBool()) g = relu_grad_bf16(g, saved[2]);
    g = g.reshape({rows, w16.size(0)}).contiguous();
    // (needs_input_grad counts the tensor arguments given: the bias is the third when present.)
    auto r = linear_grads(g, x16, w16,
                          static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()),
                          ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                          ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2));
    return {r.dx, r.dw, r.db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Several linear layers reading the same x as one: weights [out_i, in] concatenated to
// [sum out_i, in] (w16, bf16), biases likewise (b16), one product, outputs split off the last
// dimension (views of one [..., sum out_i] tensor). Backward: the outputs' gradients side by
// side ([rows, sum out_i], zeros for an unused output; side_by_side: read in place where they
// already lie so), one input-gradient product (the sum of the layers' input gradients,
// accumulated inside the GEMM in float32: kept in float32 for a float32 x where mllm's bf16
// products run, else rounded once to bf16, instead of one rounded product per layer summed
// afterwards), one float32 weight-gradient product and one bias sum, split back to the layers.
class Bf16Linears : public torch::autograd::Function<Bf16Linears> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, at::TensorList weights,
                                                at::TensorList biases, const torch::Tensor& w16,
                                                const std::optional<torch::Tensor>& b16) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    torch::Tensor x16 = x.scalar_type() == torch::kBFloat16 ? x : x.to(torch::kBFloat16);
    std::vector<int64_t> outs;
    for (const auto& w : weights) outs.push_back(w.size(0));
    ctx->save_for_backward({x16, w16});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["outs"] = outs;
    ctx->saved_data["bias"] = !biases.empty();
    return forward_bf16(x16, w16, b16, /*relu=*/false).split_with_sizes(outs, -1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x16 = saved[0];
    const torch::Tensor& w16 = saved[1];
    const std::vector<int64_t> outs = ctx->saved_data["outs"].toIntVector();
    const auto n = outs.size();
    const bool bias = ctx->saved_data["bias"].toBool();
    const int64_t rows = c10::multiply_integers(x16.sizes().begin(), x16.sizes().end() - 1);
    std::vector<torch::Tensor> parts;
    for (size_t i = 0; i < n; ++i)
      parts.push_back(grad_out[i].defined()
                          ? grad_out[i].to(torch::kBFloat16).reshape({rows, outs[i]})
                          : torch::zeros({rows, outs[i]}, x16.options()));
    const torch::Tensor g = side_by_side(parts);  // [rows, sum out_i] bf16
    bool weight_grads = false, bias_grads = false;
    for (size_t i = 0; i < n; ++i) {
      weight_grads = weight_grads || ctx->needs_input_grad(1 + i);
      bias_grads = bias_grads || (bias && ctx->needs_input_grad(1 + n + i));
    }
    const auto r = linear_grads(g, x16, w16,
                                static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()),
                                ctx->needs_input_grad(0), weight_grads, bias_grads);
    torch::autograd::variable_list grads(1 + n + (bias ? n : 0) + 2);
    grads[0] = r.dx;
    if (weight_grads) {
      const auto dw = r.dw.split_with_sizes(outs, 0);
      for (size_t i = 0; i < n; ++i) grads[1 + i] = dw[i];
    }
    if (bias_grads) {
      const auto db = r.db.split_with_sizes(outs, 0);
      for (size_t i = 0; i < n; ++i) grads[1 + n + i] = db[i];
    }
    return grads;
  }
};

}  // namespace

Bf16GemmPath bf16_gemm_path() { return gemm_choice().path; }

Bf16GemmPath choose_bf16_gemm(double bf16_flops, double fp32_flops, double mkl_bf16_flops) {
  return gemm_choice(bf16_flops, fp32_flops, mkl_bf16_flops).path;
}

bool bf16_gemm_choice_reads_mkl_rate() {
  const CpuIsa isa = detect_cpu_isa();
  return std::getenv("MLLM_BF16_GEMM") == nullptr && isa.avx512_bf16 && !isa.amx_bf16;
}

GemmBf16Bf16F32 mkl_gemm_bf16bf16f32() {
  // From LibTorch's own library (its static oneMKL, LP64), not whatever a preload put first.
  static const GemmBf16Bf16F32 gemm = [] {
    void* torch_cpu = ::dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY);
    return torch_cpu == nullptr ? nullptr
                                : reinterpret_cast<GemmBf16Bf16F32>(
                                      ::dlsym(torch_cpu, "cblas_gemm_bf16bf16f32"));
  }();
  return gemm;
}

bool bf16_products_in_mllm() { return own_gemm() != nullptr; }

GemmBf16Bf16F32 bf16_gemm_f32() { return own_gemm(); }

Bf16GemmPath wanted_bf16_gemm_path(const std::string& env, bool amx_bf16, bool avx512_bf16,
                                   double bf16_flops, double fp32_flops, double mkl_bf16_flops) {
  if (env != "" && env != "mkl" && env != "sgemm" && env != "aten")
    throw ConfigError("MLLM_BF16_GEMM must be unset, mkl, sgemm or aten, not '" + env + "'");
  if (env == "aten") return Bf16GemmPath::kAten;
  if (env == "sgemm") return Bf16GemmPath::kSgemm;
  if (env == "mkl") return amx_bf16 || avx512_bf16 ? Bf16GemmPath::kMkl : Bf16GemmPath::kAten;
  if (amx_bf16) return Bf16GemmPath::kMkl;
  const bool measured = bf16_flops > 0 && fp32_flops > 0;
  if (measured && bf16_flops < kSgemmBelowRatio * fp32_flops) return Bf16GemmPath::kSgemm;
  if (measured && avx512_bf16 && mkl_bf16_flops >= kMklFromRatio * bf16_flops)
    return Bf16GemmPath::kMkl;
  return Bf16GemmPath::kAten;
}

namespace {
// A thread's scratch for one widened operand: 64-byte aligned whatever the thread's history
// (oneMKL documents results that may depend on the operands' alignment outside its
// conditional-numerical-reproducibility mode; c10's tensors are 64-byte aligned too), grown as
// needed and kept for the thread's next call.
class AlignedScratch {
 public:
  ~AlignedScratch() { std::free(p_); }
  float* get(size_t floats) {
    if (floats > size_) {
      std::free(p_);
      size_ = 0;
      p_ = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
      if (p_ == nullptr) throw std::bad_alloc();
      size_ = floats;
    }
    return p_;
  }

 private:
  float* p_ = nullptr;
  size_t size_ = 0;
};
}  // namespace

void sgemm_on_widened_bf16(int /*layout: row-major*/, int transa, int transb, int m, int n, int k,
                           float alpha, const void* a, int lda, const void* b, int ldb, float beta,
                           float* c, int ldc) {
  // op(A) is [m, k]: stored [k, m] when transposed. Widened contiguous, as stored.
  const bool ta = transa == cblas::kTrans, tb = transb == cblas::kTrans;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  thread_local AlignedScratch a_scratch, b_scratch;
  float* a32 = a_scratch.get(static_cast<size_t>(a_rows * a_cols));
  float* b32 = b_scratch.get(static_cast<size_t>(b_rows * b_cols));
  widen(static_cast<const uint16_t*>(a), a_rows, a_cols, lda, a32);
  widen(static_cast<const uint16_t*>(b), b_rows, b_cols, ldb, b32);
  // (A leading dimension of at least 1, as sgemm_ requires even for an empty operand.)
  mkl_sgemm_row_major(ta, tb, m, n, k, alpha, a32, static_cast<int>(std::max<int64_t>(1, a_cols)),
                      b32, static_cast<int>(std::max<int64_t>(1, b_cols)), beta, c, ldc);
}

std::string describe_bf16_gemm() {
  const GemmChoice& c = gemm_choice();
  switch (c.path) {
    case Bf16GemmPath::kMkl:
      return "oneMKL's cblas_gemm_bf16bf16f32 (float32 results): " + c.why;
    case Bf16GemmPath::kSgemm:
      return "oneMKL's float32 sgemm on the bf16 operands widened to float32: " + c.why;
    case Bf16GemmPath::kAten:
      break;
  }
  return "ATen's bf16 products (autocast's linear layers): " + c.why;
}

torch::Tensor weight_grad_float32(const torch::Tensor& g, const torch::Tensor& x) {
  if (g.dim() != 2 || x.dim() != 2 || g.size(0) != x.size(0) ||
      g.scalar_type() != torch::kBFloat16 || x.scalar_type() != torch::kBFloat16)
    throw Error(c10::str("weight_grad_float32: expected g [rows, out] and x [rows, in] bf16, got ",
                         g.sizes(), " ", g.scalar_type(), " and ", x.sizes(), " ", x.scalar_type()));
  const int64_t rows = g.size(0), out = g.size(1), in = x.size(1);
  const GemmBf16Bf16F32 gemm = own_gemm();
  if (sgemm_path() && g.is_cpu() && x.is_cpu()) {
    // ATen's float32 mm on widened tensors: no thread-local scratch of the operands' size.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return at::mm(widened(g).t(), widened(x));
  }
  if (gemm == nullptr || !g.is_cpu() || !x.is_cpu() || rows > INT_MAX || out > INT_MAX ||
      in > INT_MAX)
    return at::mm(g.t(), x).to(torch::kFloat);
  const torch::Tensor gc = g.contiguous(), xc = x.contiguous();
  torch::Tensor dw = torch::empty({out, in}, g.options().dtype(torch::kFloat));
  if (rows == 0 || out == 0 || in == 0) return dw.zero_();
  RECORD_FUNCTION("mkl::cblas_gemm_bf16bf16f32", std::vector<c10::IValue>({gc, xc}));
  // dW [out, in] = op(A) op(B) with A = g stored [rows, out] (transposed: lda = out) and
  // B = x stored [rows, in] (lda = in).
  gemm(cblas::kRowMajor, cblas::kTrans, cblas::kNoTrans, static_cast<int>(out),
       static_cast<int>(in), static_cast<int>(rows), 1.0f, gc.data_ptr(), static_cast<int>(out),
       xc.data_ptr(), static_cast<int>(in), 0.0f, dw.data_ptr<float>(), static_cast<int>(in));
  return dw;
}

torch::Tensor relu_grad_bf16(const torch::Tensor& g_any, const torch::Tensor& y_any) {
  if (g_any.scalar_type() != torch::kBFloat16 || y_any.scalar_type() != torch::kBFloat16 ||
      g_any.sizes() != y_any.sizes() || !g_any.is_cpu() || !y_any.is_cpu())
    throw Error(c10::str("relu_grad_bf16: expected g and y bf16 CPU tensors of one shape, got ",
                         g_any.sizes(), " ", g_any.scalar_type(), " and ", y_any.sizes(), " ",
                         y_any.scalar_type()));
  const torch::Tensor g = g_any.contiguous(), y = y_any.contiguous();
  torch::Tensor out = torch::empty_like(g, at::MemoryFormat::Contiguous);
  const auto* gp = reinterpret_cast<const uint16_t*>(g.const_data_ptr());
  const auto* yp = reinterpret_cast<const uint16_t*>(y.const_data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, g.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    relu_grad_bits(gp + begin, yp + begin, op + begin, end - begin);
  });
  return out;
}

torch::Tensor bias_grad_float32(const torch::Tensor& g) {
  if (g.dim() != 2 || g.scalar_type() != torch::kBFloat16)
    throw Error(c10::str("bias_grad_float32: expected g [rows, out] bf16, got ", g.sizes(), " ",
                         g.scalar_type()));
  const int64_t rows = g.size(0), out = g.size(1);
  const GemmBf16Bf16F32 gemm = own_gemm();
  // Under kSgemm a product with a ones vector would widen all of g for it: ATen's sum instead.
  if (gemm == nullptr || sgemm_path() || !g.is_cpu() || rows > INT_MAX || out > INT_MAX)
    return at::sum(g, {0}, /*keepdim=*/false, torch::kFloat);
  const torch::Tensor gc = g.contiguous();
  torch::Tensor db = torch::empty({out}, g.options().dtype(torch::kFloat));
  if (rows == 0 || out == 0) return db.zero_();
  const torch::Tensor ones = torch::ones({rows}, g.options());
  RECORD_FUNCTION("mkl::cblas_gemm_bf16bf16f32", std::vector<c10::IValue>({gc, ones}));
  // db [out, 1] = g^T [out, rows] @ ones [rows, 1]: A = g stored [rows, out] (transposed).
  gemm(cblas::kRowMajor, cblas::kTrans, cblas::kNoTrans, static_cast<int>(out), 1,
       static_cast<int>(rows), 1.0f, gc.data_ptr(), static_cast<int>(out), ones.data_ptr(), 1,
       0.0f, db.data_ptr<float>(), 1);
  return db;
}

namespace {
// The forward of Bf16Linear outside grad mode (evaluation, generation, activation checkpointing's
// first pass): the same values as in training, so that a checkpointed block's recomputation
// gives its first pass's activations.
torch::Tensor forward_no_grad(const torch::Tensor& x, const torch::Tensor& w16,
                              const std::optional<torch::Tensor>& b16, bool relu) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return forward_bf16(x.scalar_type() == torch::kBFloat16 ? x : x.to(torch::kBFloat16), w16, b16,
                      relu);
}

// Autocast's cached bf16 copy of a float32 parameter (one per tensor while the cache lives),
// detached: its own cast node never runs, the gradient reaches the parameter in float32.
torch::Tensor cached_bf16(const torch::Tensor& t) {
  return at::autocast::cached_cast(at::kBFloat16, t, c10::DeviceType::CPU).detach();
}
}  // namespace

torch::Tensor bf16_autocast_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias, bool relu) {
  MLLM_CHECK(x.is_cpu() && weight.is_cpu(), "bf16_autocast_linear: CPU tensors only");
  std::optional<torch::Tensor> b, b16;
  if (bias.defined()) {
    b = bias;
    b16 = cached_bf16(bias);
  }
  if (!torch::GradMode::is_enabled()) return forward_no_grad(x, cached_bf16(weight), b16, relu);
  return Bf16Linear::apply(x, weight, b, cached_bf16(weight), b16, relu);
}

std::vector<torch::Tensor> bf16_autocast_linears(const torch::Tensor& x,
                                                 const std::vector<torch::Tensor>& weights,
                                                 const std::vector<torch::Tensor>& biases) {
  MLLM_CHECK(!weights.empty() && (biases.empty() || biases.size() == weights.size()),
             "bf16_autocast_linears: one bias per weight, or none");
  std::vector<torch::Tensor> w16, b16;
  for (const auto& w : weights) {
    MLLM_CHECK(w.is_cpu() && w.dim() == 2 && w.size(1) == weights[0].size(1),
               "bf16_autocast_linears: CPU weights [out_i, in] with one in");
    w16.push_back(cached_bf16(w));
  }
  for (size_t i = 0; i < biases.size(); ++i) {
    MLLM_CHECK(biases[i].is_cpu() && biases[i].dim() == 1 &&
                   biases[i].size(0) == weights[i].size(0),
               "bf16_autocast_linears: biases [out_i] on the CPU, one per weight");
    b16.push_back(cached_bf16(biases[i]));
  }
  MLLM_CHECK(x.is_cpu(), "bf16_autocast_linears: CPU tensors only");
  std::optional<torch::Tensor> bcat;
  if (!b16.empty()) bcat = at::cat(b16);
  if (!torch::GradMode::is_enabled()) {
    std::vector<int64_t> outs;
    for (const auto& w : weights) outs.push_back(w.size(0));
    return forward_no_grad(x, at::cat(w16), bcat, /*relu=*/false).split_with_sizes(outs, -1);
  }
  return Bf16Linears::apply(x, at::TensorList(weights), at::TensorList(biases), at::cat(w16),
                            bcat);
}

}  // namespace mllm
