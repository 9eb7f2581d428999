// The keep bits of mllm's counter-based CPU dropout (dropout.h), shared by the kernels that apply
// a dropout mask inside a fused pass (dropout.cpp, cpu_attention.cpp, norm.cpp): element i of a
// call's contiguous output is kept when its 24-bit field of mix(seed, i / 2) is >= the call's
// drop threshold, so a fused kernel draws exactly the mask mllm::dropout would.
#pragma once

#include <cstdint>

namespace mllm::dropout_bits {

// SplitMix64's output function (Steele, Lea, Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014) applied to seed + (i + 1) * golden gamma: a different 64-bit value
// for every element pair i, independent of how the range is split across threads.
inline uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The keep bits of elements 2j and 2j + 1: bits 40..63 and 16..39 of mix(seed, j) (one hash
// serves a pair). An element is kept when its bits are >= the drop threshold.
struct PairBits {
  uint32_t even, odd;
};
inline PairBits pair_bits(uint64_t seed, int64_t j) {
  const uint64_t h = mix(seed, static_cast<uint64_t>(j));
  return {static_cast<uint32_t>(h >> 40), static_cast<uint32_t>(h >> 16) & 0xFFFFFFu};
}

}  // namespace mllm::dropout_bits
