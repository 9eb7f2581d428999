// Float32 linear layers on the CPU for training (f32_linear.h).
#include "mllm/kernels/cpu/f32_linear.h"

#include <cstring>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/util/accumulate.h>

#include "mllm/core/error.h"

namespace mllm {
namespace {

// x2d [rows, in] float32, weight [out, in] float32, bias [out] float32 or undefined -> [rows,
// out] = bias + x2d @ weight^T: the bias copied into each row, then one GEMM with alpha = beta =
// 1 over it (addmm with the output as its own input adds nothing: ATen copies `self` into the
// output only when they differ), which is what ATen's addmm computes after its broadcast copy.
torch::Tensor forward_f32(const torch::Tensor& x2d, const torch::Tensor& weight,
                          const std::optional<torch::Tensor>& bias) {
  const int64_t rows = x2d.size(0), out = weight.size(0);
  torch::Tensor y = torch::empty({rows, out}, x2d.options());
  if (!bias.has_value()) return at::mm_out(y, x2d, weight.t());
  const torch::Tensor b = bias->contiguous();
  const float* bp = b.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(out, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r)
                       std::memcpy(yp + r * out, bp, static_cast<size_t>(out) * sizeof(float));
                   });
  return at::addmm_out(y, y, x2d, weight.t());
}

// The rows of x [..., in]: the product of the leading dimensions (explicit, so that a zero-size
// dimension cannot leave a -1 unresolved).
int64_t rows_of(const torch::Tensor& x) {
  return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
}

// x's shape with the last dimension replaced by `out`.
std::vector<int64_t> shape_with_last(const torch::Tensor& x, int64_t out) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  return shape;
}

// The gradients of y = x2d @ w^T + b from g [rows, out], each only when asked for (undefined
// otherwise): dx [x_shape], dw [out, in], db [out] (AddmmBackward's products and sum).
torch::autograd::variable_list linear_grads(const torch::Tensor& g, const torch::Tensor& x2d,
                                            const torch::Tensor& w, at::IntArrayRef x_shape,
                                            bool need_dx, bool need_dw, bool need_db) {
  torch::Tensor dx, dw, db;
  if (need_dx) dx = at::mm(g, w).view(x_shape);
  if (need_dw) dw = at::mm(g.t(), x2d);
  if (need_db) db = g.sum(0);
  return {dx, dw, db};
}

class F32Linear : public torch::autograd::Function<F32Linear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias, bool relu) {
    const torch::Tensor x2d = x.reshape({rows_of(x), x.size(-1)}).contiguous();
    torch::Tensor y = forward_f32(x2d, weight, bias);
    if (relu) y.clamp_min_(0);  // torch::relu's values (a NaN stays NaN)
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["relu"] = relu;
    // A plain tensor, not a view of y: a view made inside a custom Function could not be
    // modified in place. With ReLU that very tensor is saved (autograd then sees it as this
    // node's output, whose in-place change makes the backward throw); y itself would have a
    // version counter of its own.
    torch::Tensor out = at::_unsafe_view(y, shape_with_last(x, weight.size(0)));
    ctx->save_for_backward(relu ? torch::autograd::variable_list{x2d, weight, out}
                                : torch::autograd::variable_list{x2d, weight});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x2d = saved[0];
    const torch::Tensor& w = saved[1];
    torch::Tensor g = grad_out[0].reshape({x2d.size(0), w.size(0)});
    // ReLU's gradient: zero where the output is <= 0 (PyTorch's relu backward, threshold 0).
    if (ctx->saved_data["relu"].toBool())
      g = at::threshold_backward(g, saved[2].reshape({x2d.size(0), w.size(0)}), 0);
    const std::vector<int64_t> x_shape = ctx->saved_data["x_shape"].toIntVector();
    // (needs_input_grad counts the tensor arguments given: the bias is the third when present.)
    auto grads = linear_grads(g, x2d, w, x_shape, ctx->needs_input_grad(0),
                              ctx->needs_input_grad(1),
                              ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2));
    grads.push_back(torch::Tensor());  // relu
    return grads;
  }
};

class F32Linears : public torch::autograd::Function<F32Linears> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, at::TensorList weights,
                                                at::TensorList biases) {
    const torch::Tensor x2d = x.reshape({rows_of(x), x.size(-1)}).contiguous();
    const torch::Tensor w = at::cat(weights);  // [sum out_i, in]
    std::optional<torch::Tensor> b;
    if (!biases.empty()) b = at::cat(biases);
    std::vector<int64_t> outs;
    for (const auto& wi : weights) outs.push_back(wi.size(0));
    // The weights themselves are saved, not their concatenation (made again in the backward):
    // a saved parameter is what torch::linear keeps too, so ZeRO stage 3 can free and gather it
    // as usual instead of a full copy living until the backward.
    torch::autograd::variable_list keep{x2d};
    for (const auto& wi : weights) keep.push_back(wi);
    ctx->save_for_backward(keep);
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["outs"] = outs;
    ctx->saved_data["bias"] = !biases.empty();
    const torch::Tensor y = forward_f32(x2d, w, b);
    return at::_unsafe_view(y, shape_with_last(x, w.size(0))).split_with_sizes(outs, -1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x2d = saved[0];
    const torch::Tensor w = at::cat(at::TensorList(saved).slice(1));  // [sum out_i, in]
    const std::vector<int64_t> outs = ctx->saved_data["outs"].toIntVector();
    const std::vector<int64_t> x_shape = ctx->saved_data["x_shape"].toIntVector();
    const auto n = outs.size();
    const bool bias = ctx->saved_data["bias"].toBool();
    const int64_t rows = x2d.size(0);
    std::vector<torch::Tensor> parts;
    for (size_t i = 0; i < n; ++i)
      parts.push_back(grad_out[i].defined() ? grad_out[i].reshape({rows, outs[i]})
                                            : torch::zeros({rows, outs[i]}, x2d.options()));
    const torch::Tensor g = side_by_side(parts);  // [rows, sum out_i]
    bool weight_grads = false, bias_grads = false;
    for (size_t i = 0; i < n; ++i) {
      weight_grads = weight_grads || ctx->needs_input_grad(1 + i);
      bias_grads = bias_grads || (bias && ctx->needs_input_grad(1 + n + i));
    }
    const auto r = linear_grads(g, x2d, w, x_shape, ctx->needs_input_grad(0), weight_grads,
                                bias_grads);
    torch::autograd::variable_list grads(1 + n + (bias ? n : 0));
    grads[0] = r[0];
    if (weight_grads) {
      const auto dw = r[1].split_with_sizes(outs, 0);
      for (size_t i = 0; i < n; ++i) grads[1 + i] = dw[i];
    }
    if (bias_grads) {
      const auto db = r[2].split_with_sizes(outs, 0);
      for (size_t i = 0; i < n; ++i) grads[1 + n + i] = db[i];
    }
    return grads;
  }
};

// Throws mllm::Error (naming `what`) unless weight is [out, in] for x [..., in] and bias, when
// defined, is [out], all float32 CPU tensors, outside CPU autocast.
void check_layer(const char* what, const torch::Tensor& x, const torch::Tensor& weight,
                 const torch::Tensor& bias) {
  MLLM_CHECK(f32_cpu_linear(x, weight),
             std::string(what) + ": float32 CPU x and weight, outside CPU autocast");
  MLLM_CHECK(x.dim() >= 1 && weight.dim() == 2 && weight.size(1) == x.size(-1),
             std::string(what) + ": expected weight [out, in] for x [..., in]");
  MLLM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                                 bias.is_cpu() && bias.scalar_type() == torch::kFloat),
             std::string(what) + ": expected a float32 CPU bias [out]");
}

// Whether autograd records this call: grad mode on and some input requiring grad.
bool records(const torch::Tensor& x, at::TensorList weights, at::TensorList biases) {
  if (!torch::GradMode::is_enabled()) return false;
  bool any = x.requires_grad();
  for (const auto& w : weights) any = any || w.requires_grad();
  for (const auto& b : biases) any = any || b.requires_grad();
  return any;
}

}  // namespace

bool f32_cpu_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.defined() && weight.defined() && x.is_cpu() && weight.is_cpu() &&
         x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
         !at::autocast::is_autocast_enabled(at::kCPU);
}

torch::Tensor f32_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, bool relu) {
  check_layer("f32_linear", x, weight, bias);
  std::optional<torch::Tensor> b;
  if (bias.defined()) b = bias;
  if (records(x, weight, bias.defined() ? at::TensorList(bias) : at::TensorList()))
    return F32Linear::apply(x, weight, b, relu);
  torch::Tensor y = forward_f32(x.reshape({rows_of(x), x.size(-1)}).contiguous(), weight, b);
  if (relu) y.clamp_min_(0);
  return y.view(shape_with_last(x, weight.size(0)));
}

std::vector<torch::Tensor> f32_linears(const torch::Tensor& x,
                                       const std::vector<torch::Tensor>& weights,
                                       const std::vector<torch::Tensor>& biases) {
  MLLM_CHECK(!weights.empty() && (biases.empty() || biases.size() == weights.size()),
             "f32_linears: one bias per weight, or none");
  for (size_t i = 0; i < weights.size(); ++i)
    check_layer("f32_linears", x, weights[i], biases.empty() ? torch::Tensor() : biases[i]);
  if (records(x, weights, biases))
    return F32Linears::apply(x, at::TensorList(weights), at::TensorList(biases));
  std::optional<torch::Tensor> b;
  if (!biases.empty()) b = at::cat(biases);
  const torch::Tensor w = at::cat(weights);
  std::vector<int64_t> outs;
  for (const auto& wi : weights) outs.push_back(wi.size(0));
  return forward_f32(x.reshape({rows_of(x), x.size(-1)}).contiguous(), w, b)
      .view(shape_with_last(x, w.size(0)))
      .split_with_sizes(outs, -1);
}

torch::Tensor side_by_side(const std::vector<torch::Tensor>& parts) {
  MLLM_CHECK(!parts.empty(), "side_by_side: no parts");
  const torch::Tensor& first = parts.front();
  const int64_t rows = first.size(0);
  int64_t cols = 0;
  bool adjacent = rows > 1;
  for (const auto& p : parts) {
    adjacent = adjacent && p.scalar_type() == first.scalar_type() && p.size(0) == rows &&
               p.stride(1) == 1 && p.stride(0) == first.stride(0) &&
               p.storage().is_alias_of(first.storage()) &&
               p.storage_offset() == first.storage_offset() + cols;
    cols += p.size(1);
  }
  if (adjacent && first.stride(0) >= cols)
    return first.as_strided({rows, cols}, {first.stride(0), 1});
  return at::cat(parts, 1);
}

}  // namespace mllm
