// The normalizations of kernels/norm.h, forward + backward, against LibTorch's compositions on the
// same float32 inputs, interleaved: with rms=0 a post-LN block's residual step,
// mllm::dropout_add_layer_norm against torch::layer_norm(residual + mllm::dropout(branch)) in
// training with dropout p; with rms=1 mllm::rms_norm against llama's former composition
// x * rsqrt(mean(x^2) + eps) * weight. Prints the median microseconds of each and their ratio.
// Run: mllm_bench_norm [rows=1024] [d_model=128] [iters=200] [p_permille=100] [rms=0]
//      (threads: OMP_NUM_THREADS; the defaults are the mini shape's per-rank micro-batch, 16 x 64
//      tokens; the small shape's: 2048 512)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "mllm/model/dropout.h"
#include "mllm/model/norm.h"

#include "bench_util.h"

using Clock = std::chrono::steady_clock;

using mllm::bench::arg;
using mllm::bench::median;

int main(int argc, char** argv) {
  const int64_t rows = arg(argc, argv, 1, 1024), d = arg(argc, argv, 2, 128),
                iters = std::max<int64_t>(1, arg(argc, argv, 3, 200));
  const double p = static_cast<double>(arg(argc, argv, 4, 100)) / 1000.0;
  const bool rms = arg(argc, argv, 5, 0) != 0;

  torch::manual_seed(0);
  const torch::Tensor r0 = torch::randn({rows, d}), b0 = torch::randn({rows, d});
  const torch::Tensor gy = torch::randn({rows, d});
  torch::Tensor w = (1 + 0.1 * torch::randn({d})).requires_grad_(true);
  torch::Tensor bias = (0.1 * torch::randn({d})).requires_grad_(true);

  auto run = [&](bool fused) {
    torch::Tensor r = r0.detach().requires_grad_(true), b = b0.detach().requires_grad_(true);
    torch::Tensor y;
    if (rms)
      y = fused ? mllm::rms_norm(r, w, 1e-5)
                : r * torch::rsqrt(r.pow(2).mean(-1, /*keepdim=*/true) + 1e-5) * w;
    else
      y = fused ? mllm::dropout_add_layer_norm(r, b, p, true, w, bias, 1e-5)
                : torch::layer_norm(r + mllm::dropout(b, p, true), {d}, w, bias, 1e-5);
    y.backward(gy);
  };
  std::vector<double> tf, tu;
  for (int64_t i = 0; i < iters + 5; ++i) {
    for (int which = 0; which < 2; ++which) {
      w.mutable_grad() = torch::Tensor();
      bias.mutable_grad() = torch::Tensor();
      const auto t0 = Clock::now();
      run(which == 0);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= 5) (which == 0 ? tf : tu).push_back(us);
    }
  }
  const double f = median(tf), u = median(tu);
  std::printf("%s rows %lld d_model %lld p %.3f threads %d: fused %.1f us, unfused %.1f us, %.2fx\n",
              rms ? "rms_norm" : "dropout_add_layer_norm", static_cast<long long>(rows),
              static_cast<long long>(d), rms ? 0.0 : p, at::get_num_threads(), f, u, u / f);
  return 0;
}
