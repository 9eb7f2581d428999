// The output head and the loss, forward + backward: mllm::lm_head_loss_sum (the fused head,
// chunks of rows, no logits in memory) against torch::linear + mllm::lm_loss_sum (the unfused
// path, [rows, vocab] float32 logits and their gradient), on the same float32 inputs,
// interleaved. Prints the median milliseconds of each and their ratio.
// Run: mllm_bench_head_loss [rows=1024] [d_model=128] [vocab=4096] [iters=30] [bias=1]
//      (threads: OMP_NUM_THREADS; the defaults are the mini shape's per-rank micro-batch:
//      16 x 64 tokens; the small shape's: 2048 512 8192 10; MLLM_BENCH_FUSED_ONLY=1 runs only
//      the fused head, for a profiler)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mllm/model/loss.h"

#include "bench_util.h"

using Clock = std::chrono::steady_clock;

using mllm::bench::arg;
using mllm::bench::median;

int main(int argc, char** argv) {
  const int64_t rows = arg(argc, argv, 1, 1024), d = arg(argc, argv, 2, 128),
                vocab = arg(argc, argv, 3, 4096),
                iters = std::max<int64_t>(1, arg(argc, argv, 4, 30));
  const bool with_bias = arg(argc, argv, 5, 1) != 0;

  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({1, rows, d});
  torch::Tensor w = (torch::randn({vocab, d}) * 0.05).requires_grad_(true);
  torch::Tensor b = with_bias ? torch::zeros({vocab}).requires_grad_(true) : torch::Tensor();
  const torch::Tensor targets = torch::randint(0, vocab, {1, rows}, torch::kLong);

  auto fused = [&] {
    torch::Tensor x = x0.detach().requires_grad_(true);
    mllm::lm_head_loss_sum(x, w, b, targets).mul(1.0 / rows).backward();
  };
  auto unfused = [&] {
    torch::Tensor x = x0.detach().requires_grad_(true);
    mllm::lm_loss_sum(torch::linear(x, w, b), targets).mul(1.0 / rows).backward();
  };
  const bool fused_only = std::getenv("MLLM_BENCH_FUSED_ONLY") != nullptr;
  std::vector<double> tf, tu;
  for (int64_t i = 0; i < iters + 3; ++i) {
    for (int which = 0; which < (fused_only ? 1 : 2); ++which) {
      w.mutable_grad() = torch::Tensor();  // each call starts without gradients
      if (b.defined()) b.mutable_grad() = torch::Tensor();
      const auto t0 = Clock::now();
      if (which == 0) fused(); else unfused();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (i >= 3) (which == 0 ? tf : tu).push_back(ms);
    }
  }
  const double f = median(tf);
  if (fused_only) {
    std::printf("rows %lld d_model %lld vocab %lld bias %d threads %d: fused %.2f ms\n",
                static_cast<long long>(rows), static_cast<long long>(d),
                static_cast<long long>(vocab), with_bias ? 1 : 0, at::get_num_threads(), f);
    return 0;
  }
  const double u = median(tu);
  std::printf("rows %lld d_model %lld vocab %lld bias %d threads %d: fused %.2f ms, unfused %.2f "
              "ms, %.2fx\n",
              static_cast<long long>(rows), static_cast<long long>(d),
              static_cast<long long>(vocab), with_bias ? 1 : 0, at::get_num_threads(), f, u, u / f);
  return 0;
}
