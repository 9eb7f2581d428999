// Summed token cross-entropy that ignores pad targets, as one autograd node (kernels/cross_entropy.h):
// on the CPU row passes that keep the logits and per-row statistics and recompute the softmax in
// the backward pass (kernels/cpu/cross_entropy.h); elsewhere float32 logits keep the softmax,
// which the backward pass turns into the gradient in place. And the float32 CPU head and loss as
// one (lm_head_loss_sum): the same row passes over chunks of rows whose logits never leave the
// cache, the gradients computed in the forward pass.
#include "mllm/kernels/cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <ATen/autocast_mode.h>

#include "mllm/core/error.h"
#include "mllm/core/special_tokens.h"
#include "mllm/kernels/cpu/cross_entropy.h"

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

// x [rows, vocab] bf16 or half contiguous -> per-row log-sum-exp [rows] float32: lse_rows_bf16
// for bf16 on the CPU; otherwise the max / exp / sum over float32 copies of cache-sized chunks.
torch::Tensor row_lse_reduced(const torch::Tensor& x) {
  if (cpu::bf16_rows_apply(x)) return cpu::row_lse_bf16(x);
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
    if (cpu::bf16_rows_apply(x)) return {cpu::ce_grad_bf16(x, lse, scale, targets), torch::Tensor()};
    torch::Tensor grad = torch::empty_like(x);
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

// The same loss for float32 logits on the CPU, with the row kernels (cpu/cross_entropy.h): the forward pass
// keeps the logits and each row's maximum and sum of exponentials (no [rows, vocab] softmax
// buffer: two reads of each row in cache instead of ATen's max / subtract / exp / sum / divide
// passes over it); the backward pass recomputes exp(x - max) and writes the gradient in one
// pass. The logits must not be modified in place between the passes (autograd's version check
// says so).
class SummedCrossEntropyCpu : public torch::autograd::Function<SummedCrossEntropyCpu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& targets) {
    auto [mx, sum] = cpu::softmax_stats_f32(x);
    ctx->save_for_backward({x, mx, sum, targets});
    return reduced_loss_sum(x, targets, sum.log().add_(mx));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& targets = saved[3];
    // Per-row factor: the upstream gradient on real targets, 0 on pad targets.
    const torch::Tensor scale =
        targets.ne(kPadId).to(torch::kFloat).mul_(grad_out[0].to(torch::kFloat));
    const torch::Tensor factor = scale / saved[2];
    return {cpu::ce_grad_f32(x, saved[1], factor, scale, targets), torch::Tensor()};
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
    cpu::HeadLoss r = cpu::head_loss_chunks(x, weight, b, targets, ctx->needs_input_grad(0),
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
  if (cpu::f32_rows_apply(x)) {
    if (grad) return SummedCrossEntropyCpu::apply(x, t);
    torch::NoGradGuard no_grad;
    auto [mx, sum] = cpu::softmax_stats_f32(x);
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
  return cpu::head_loss_chunks(x2, w, b, t, false, false, false).loss;
}

}  // namespace mllm
