// 16 float32 lanes as GCC's vector extension types (also Clang's), for the row passes of
// mllm's CPU kernels (cpu_attention.cpp, loss.cpp, norm.cpp): one AVX-512 register, two
// AVX2 ones, four SSE ones — the compiler lowers the operations to each target_clones version of
// the function that uses them. They serve where GCC's loop vectorizer leaves a plain loop scalar
// (selects, maxima, a polynomial inside a reduction). Internal, for .cpp files only: the helpers
// are always inlined, so no vector crosses a call; GCC's -Wpsabi note on the baseline clone of
// such a function (which a pragma does not silence) is turned off with -Wno-psabi for each file
// that includes this header (framework/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <cstring>

namespace mllm::vec16 {

constexpr int64_t kLanes = 16;
typedef float Floats __attribute__((vector_size(kLanes * 4)));
typedef int32_t Ints __attribute__((vector_size(kLanes * 4)));
typedef uint32_t Uints __attribute__((vector_size(kLanes * 4)));
typedef uint16_t Halves __attribute__((vector_size(kLanes * 2)));

template <typename V, typename T>
[[gnu::always_inline]] inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
[[gnu::always_inline]] inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}
[[gnu::always_inline]] inline Floats splat(float x) { return Floats{} + x; }

// exp(x) for x <= 0 in float32 on 16 lanes: Cephes' expf (S. L. Moshier, Cephes Math Library,
// expf.c): x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so that n * 0.693359375 is
// exact), e^r = 1 + r + r^2 p(r) with Cephes' degree-5 p, times 2^n built in the exponent bits.
// Relative error ~1e-7 (1-2 units in the last place) for x >= -87; below, e^-87 (~1.6e-38)
// instead of a smaller number or 0: negligible where it joins a sum >= 1 (a row's maximum gives
// e^0); attention gives masked places 0 itself, the loss lets a -inf logit have e^-87 times the
// upstream gradient.
[[gnu::always_inline]] inline Floats exp_nonpositive(Floats x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const Floats n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  Floats r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Floats p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return p * reinterpret_cast<Floats>((__builtin_convertvector(n, Ints) + 127) << 23);
}
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  return exp_nonpositive(splat(x))[0];
}

// c10's round_to_nearest_even (float32 -> bf16 bits, NaN -> 0x7FC0) on 16 lanes.
[[gnu::always_inline]] inline Halves to_bf16(Floats f) {
  const Uints u = reinterpret_cast<Uints>(f);
  const Uints rounded = (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
  return __builtin_convertvector(f != f ? Uints{} + 0x7FC0u : rounded, Halves);
}
[[gnu::always_inline]] inline Floats from_bf16(Halves h) {
  return reinterpret_cast<Floats>(__builtin_convertvector(h, Uints) << 16);
}

// mllm::dropout's keep bits (dropout_bits.h, the same SplitMix64 constants) of the 16 elements
// 2j .. 2j + 15 (the pairs j .. j + 7: dropout_bits::pair_bits on 8 lanes, the even element's
// field then the odd one's) as 16 lanes, -1 where the element is kept (its field >= threshold),
// else 0.
typedef uint64_t Longs8 __attribute__((vector_size(8 * 8)));
typedef uint32_t Uints8 __attribute__((vector_size(8 * 4)));
[[gnu::always_inline]] inline Ints keep16(uint64_t seed, int64_t j, uint32_t threshold) {
  const Longs8 i = Longs8{1, 2, 3, 4, 5, 6, 7, 8} + static_cast<uint64_t>(j);  // pair index + 1
  Longs8 z = seed + i * 0x9E3779B97F4A7C15ull;                               // dropout_bits::mix
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  const Uints8 even = __builtin_convertvector(z >> 40, Uints8);
  const Uints8 odd = __builtin_convertvector((z >> 16) & 0xFFFFFFull, Uints8);
  const Uints bits = __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6,
                                             14, 7, 15);
  return bits >= threshold;
}

}  // namespace mllm::vec16
