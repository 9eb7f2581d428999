// Summed token cross-entropy that ignores pad targets, as one autograd node: the forward pass
// keeps the softmax it computes, the backward pass turns it into the gradient in place.
#include "mllm/model/loss.h"

#include <algorithm>
#include <string>

#include "mllm/core/error.h"
#include "mllm/model/model.h"

namespace mllm {

namespace {
std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Rows per chunk on CPU: about 1 MiB of float32 logits, so that the max, exp, sum and scale
// passes over a chunk run in cache instead of streaming the whole [rows, vocab] matrix four
// times. On an accelerator one chunk (each op is one kernel launch there).
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

// x [rows, vocab] bf16 or half contiguous -> per-row log-sum-exp [rows] float32 (the same max /
// exp / sum as row_losses, over float32 copies of cache-sized chunks).
torch::Tensor row_lse_reduced(const torch::Tensor& x) {
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

// x [rows, vocab] bf16 or half, targets [rows] int64, lse [rows] float32 -> [] float32: the sum
// over non-pad rows of lse - x[target].
torch::Tensor reduced_loss_sum(const torch::Tensor& x, const torch::Tensor& targets,
                               const torch::Tensor& lse) {
  torch::Tensor target_logit = x.gather(1, targets.unsqueeze(1)).squeeze(1).to(torch::kFloat);
  return (lse - target_logit).masked_fill_(targets.eq(kPadId), 0.0).sum();
}

// The same loss for bf16 / half logits (bf16 autocast), with float32 arithmetic throughout:
// the forward pass keeps the logits as they are and one log-sum-exp per row; the backward pass
// recomputes exp(x - lse) in float32, subtracts the one-hot there, and rounds the gradient to
// the logits' dtype once — the same bits as the float32 path's gradient rounded for the bf16
// head, without a [rows, vocab] float32 copy of the logits, a float32 softmax buffer, or their
// casts (3x less memory traffic over the vocabulary).
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
}  // namespace

torch::Tensor lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) ||
      logits.size(1) != targets.size(1))
    throw Error("lm_loss_sum: logits " + shape_of(logits) + " and targets " + shape_of(targets) +
                " do not match; expected [batch, seq, vocab] and [batch, seq]");
  if (targets.scalar_type() != torch::kLong)
    throw Error("lm_loss_sum: targets must be int64, got " +
                std::string(c10::toString(targets.scalar_type())));
  const int64_t vocab = logits.size(2);
  const bool reduced = logits.scalar_type() == torch::kBFloat16 || logits.scalar_type() == torch::kHalf;
  torch::Tensor x = reduced ? logits.reshape({-1, vocab}).contiguous()
                            : logits.reshape({-1, vocab}).to(torch::kFloat).contiguous();
  torch::Tensor t = targets.reshape({-1}).contiguous();
  if (t.numel() > 0 && t.device().is_cpu()) {  // (on a GPU, gather's device assert)
    auto [lo, hi] = torch::aminmax(t);
    if (lo.item<int64_t>() < 0 || hi.item<int64_t>() >= vocab)
      throw Error("lm_loss_sum: target ids must be in [0, " + std::to_string(vocab) + "), got " +
                  std::to_string(lo.item<int64_t>()) + ".." + std::to_string(hi.item<int64_t>()));
  }
  const bool grad = torch::GradMode::is_enabled() && x.requires_grad();
  if (reduced) {
    if (grad) return SummedCrossEntropyReduced::apply(x, t);
    torch::NoGradGuard no_grad;
    return reduced_loss_sum(x, t, row_lse_reduced(x));
  }
  if (grad) return SummedCrossEntropy::apply(x, t);
  torch::NoGradGuard no_grad;
  return row_losses(x, t, torch::Tensor()).sum();
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kPadId).sum().item<int64_t>();
}

}  // namespace mllm
