// One layer's CPU attention, forward + backward: mllm::cpu_attention (the fused kernel eager
// attention uses) against the unfused path it replaced (attention.cpp before it), on the same
// inputs, interleaved. bf16: the head-major copies, baddbmm with the mask as its bias,
// mllm::softmax_dropout, a bf16 matmul, the copy back to [batch, seq, d_model]; fp32: the
// head-major copies, matmul, division by sqrt(head_dim), masked_fill(-1e9), softmax,
// mllm::dropout, matmul, the copy back. Prints the median milliseconds of each and their ratio.
// Run: mllm_bench_attention [batch=8] [seq=256] [heads=8] [head_dim=64] [kv_heads=heads]
//      [p=0.1] [iters=20] [dtype=bf16|fp32]  (threads: OMP_NUM_THREADS;
//      MLLM_BENCH_FUSED_ONLY=1 runs only the fused kernel, for a profiler)
// mini's shape: mllm_bench_attention 16 64 4 32 4 0.1 200 fp32
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mllm/kernels/cpu/attention.h"
#include "mllm/model/dropout.h"

#include "bench_util.h"

using Clock = std::chrono::steady_clock;

using mllm::bench::arg;
using mllm::bench::median;

int main(int argc, char** argv) {
  const int64_t b = arg(argc, argv, 1, 8), t = arg(argc, argv, 2, 256), h = arg(argc, argv, 3, 8),
                hd = arg(argc, argv, 4, 64), kvh = arg(argc, argv, 5, h);
  const double p = argc > 6 ? std::atof(argv[6]) : 0.1;
  const int64_t iters = arg(argc, argv, 7, 20);
  const bool fp32 = argc > 8 && std::string(argv[8]) == "fp32";
  const torch::ScalarType dtype = fp32 ? torch::kFloat : torch::kBFloat16;
  if (!mllm::cpu_attention_available(dtype)) {
    std::printf("cpu_attention does not run here for %s (no oneMKL product for it in use)\n",
                fp32 ? "fp32" : "bf16");
    return 0;
  }
  torch::manual_seed(0);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  // The split outputs of one Q/K/V product, as mllm::linears gives them.
  const torch::Tensor qkv = torch::randn({b, t, (h + 2 * kvh) * hd}).to(dtype);
  const torch::Tensor blocked = torch::ones({t, t}, torch::kBool).triu(1).view({1, 1, t, t});
  const torch::Tensor grad = torch::randn({b, t, h * hd}).to(dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  auto fused = [&] {
    torch::Tensor leaf = qkv.detach().requires_grad_(true);
    const auto parts = leaf.split_with_sizes({h * hd, kvh * hd, kvh * hd}, -1);
    torch::Tensor out = mllm::cpu_attention(parts[0].view({b, t, h, hd}),
                                            parts[1].view({b, t, kvh, hd}),
                                            parts[2].view({b, t, kvh, hd}), blocked, scale, p,
                                            /*training=*/true);
    out.backward(grad);
  };
  auto unfused = [&] {
    torch::Tensor leaf = qkv.detach().requires_grad_(true);
    const auto parts = leaf.split_with_sizes({h * hd, kvh * hd, kvh * hd}, -1);
    torch::Tensor q = parts[0].view({b, t, h, hd}).transpose(1, 2);
    torch::Tensor k = parts[1].view({b, t, kvh, hd}).transpose(1, 2);
    torch::Tensor v = parts[2].view({b, t, kvh, hd}).transpose(1, 2);
    if (kvh != h) {
      k = k.repeat_interleave(h / kvh, 1);
      v = v.repeat_interleave(h / kvh, 1);
    }
    if (fp32) {
      torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
      scores.masked_fill_(blocked, -1e9);
      torch::Tensor attn = mllm::dropout(torch::softmax(scores, -1), p, /*training=*/true);
      torch::matmul(attn, v).transpose(1, 2).reshape({b, t, h * hd}).backward(grad);
      return;
    }
    const torch::Tensor bias =
        torch::zeros({1, t, t}, bf16).masked_fill_(blocked.view({1, t, t}), -1e9);
    torch::Tensor scores = at::baddbmm(bias, q.reshape({b * h, t, hd}),
                                       k.reshape({b * h, t, hd}).transpose(1, 2), 1, scale)
                               .view({b, h, t, t});
    torch::Tensor attn = mllm::softmax_dropout(scores, p, /*training=*/true);
    torch::Tensor out = torch::matmul(attn, v).transpose(1, 2).reshape({b, t, h * hd});
    out.backward(grad);
  };
  const char* only = std::getenv("MLLM_BENCH_FUSED_ONLY");
  const bool fused_only = only != nullptr && std::string(only) == "1";
  for (int i = 0; i < 3; ++i) {
    fused();
    if (!fused_only) unfused();
  }
  std::vector<double> tf, tu;
  for (int64_t i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    fused();
    auto t1 = Clock::now();
    if (!fused_only) unfused();
    auto t2 = Clock::now();
    tf.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    tu.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  const double f = median(tf), u = median(tu);
  std::printf("attention fwd+bwd %s, batch %lld seq %lld heads %lld/%lld head_dim %lld p %.2f, "
              "%d thread(s): fused %.3f ms, unfused %.3f ms (%.2fx)\n",
              fp32 ? "fp32" : "bf16", static_cast<long long>(b), static_cast<long long>(t),
              static_cast<long long>(h), static_cast<long long>(kvh), static_cast<long long>(hd),
              p, at::get_num_threads(), f, u, u / f);
  return 0;
}
