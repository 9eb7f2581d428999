// The output head and the loss, forward + backward: mllm::lm_head_loss_sum (the fused head,
// chunks of rows, no logits in memory) against torch::linear + mllm::lm_loss_sum (the unfused
// path, [rows, vocab] float32 logits and their gradient), on the same float32 inputs,
// interleaved. Prints the median milliseconds of each and their ratio.
// With bf16=1, both under CPU bf16 autocast (training; where oneMKL's bf16 GEMM is in use): the
// fused head's bf16 path against mllm's bf16 linear (bf16_autocast_linear) + lm_loss_sum.
// Run: mllm_bench_head_loss [rows=1024] [d_model=128] [vocab=4096] [iters=30] [bias=1] [bf16=0]
//      (threads: OMP_NUM_THREADS; the defaults are the mini shape's per-rank micro-batch:
//      16 x 64 tokens; the small shape's: 2048 512 8192 10 1 1; MLLM_BENCH_FUSED_ONLY=1 runs
//      only the fused head, for a profiler)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <ATen/autocast_mode.h>

#include "mllm/model/bf16_linear.h"
#include "mllm/model/loss.h"

using Clock = std::chrono::steady_clock;

namespace {

int64_t arg(int argc, char** argv, int i, int64_t fallback) {
  return argc > i ? std::atoll(argv[i]) : fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = arg(argc, argv, 1, 1024), d = arg(argc, argv, 2, 128),
                vocab = arg(argc, argv, 3, 4096), iters = arg(argc, argv, 4, 30);
  const bool with_bias = arg(argc, argv, 5, 1) != 0;
  const bool bf16 = arg(argc, argv, 6, 0) != 0;
  if (bf16 && !mllm::bf16_weight_grad_uses_mkl()) {
    std::printf("the fused head's bf16 path does not run here (no oneMKL bf16 GEMM in use)\n");
    return 0;
  }
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({1, rows, d});
  torch::Tensor w = (torch::randn({vocab, d}) * 0.05).requires_grad_(true);
  torch::Tensor b = with_bias ? torch::zeros({vocab}).requires_grad_(true) : torch::Tensor();
  const torch::Tensor targets = torch::randint(0, vocab, {1, rows}, torch::kLong);

  // CPU bf16 autocast on for a pass (its cache, the bf16 weight copies, cleared after it).
  auto autocast = [&](bool on) {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, on);
    if (!on) at::autocast::clear_cache();
  };
  auto fused = [&] {
    torch::Tensor x = x0.detach().requires_grad_(true);
    autocast(bf16);
    torch::Tensor loss = mllm::lm_head_loss_sum(x, w, b, targets);
    autocast(false);
    loss.mul(1.0 / rows).backward();
  };
  auto unfused = [&] {
    torch::Tensor x = x0.detach().requires_grad_(true);
    autocast(bf16);
    torch::Tensor logits = bf16 ? mllm::bf16_autocast_linear(x, w, b) : torch::linear(x, w, b);
    torch::Tensor loss = mllm::lm_loss_sum(logits, targets);
    autocast(false);
    loss.mul(1.0 / rows).backward();
  };
  const bool fused_only = std::getenv("MLLM_BENCH_FUSED_ONLY") != nullptr;
  std::vector<double> tf, tu{0.0};
  for (int64_t i = 0; i < iters + 3; ++i) {
    for (int which = 0; which < (fused_only ? 1 : 2); ++which) {
      const auto t0 = Clock::now();
      if (which == 0) fused(); else unfused();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (i >= 3) (which == 0 ? tf : tu).push_back(ms);
    }
    w.mutable_grad() = torch::Tensor();
    if (b.defined()) b.mutable_grad() = torch::Tensor();
  }
  const double f = median(tf), u = median(tu);
  std::printf("rows %lld d_model %lld vocab %lld bias %d %s threads %d: fused %.2f ms, unfused "
              "%.2f ms, %.2fx\n",
              static_cast<long long>(rows), static_cast<long long>(d),
              static_cast<long long>(vocab), with_bias ? 1 : 0, bf16 ? "bf16" : "float32",
              at::get_num_threads(), f, u, u / f);
  return 0;
}
