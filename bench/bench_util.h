// Small helpers the single-process benchmarks share (attention_bench.cpp, head_loss_bench.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace mllm::bench {

// The i-th command-line argument as an integer (std::atoll: 0 for text that is not a number),
// or `fallback` when there are fewer than i arguments.
inline int64_t arg(int argc, char** argv, int i, int64_t fallback) {
  return argc > i ? std::atoll(argv[i]) : fallback;
}

// The median of v (the upper one for an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace mllm::bench
