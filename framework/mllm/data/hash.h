// FNV-1a 64-bit hashing (Fowler, Noll, Vo; http://www.isthe.com/chongo/tech/comp/fnv/), used for
// tokenizer fingerprints and the data fingerprint in the cache manifest. Stable across platforms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mllm {

inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
inline constexpr uint64_t kFnv1a64Prime = 1099511628211ull;

// Incremental FNV-1a 64. Integers are fed as 8 little-endian bytes so values hash the same on
// every platform.
class Fnv1a64 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * kFnv1a64Prime;
  }
  void update(std::string_view s) {
    update_u64(s.size());  // length prefix: ("ab","c") and ("a","bc") differ
    update(s.data(), s.size());
  }
  void update_u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) h_ = (h_ ^ ((v >> (8 * i)) & 0xFF)) * kFnv1a64Prime;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kFnv1a64Offset;
};

// Fast content hash for large inputs (the corpus check reads every corpus file on each start):
// FNV-1a 64 applied to 8-byte little-endian words instead of bytes (8x fewer multiplies), the
// tail bytewise, then the splitmix64 finaliser. Not FNV-1a; stable across platforms.
// Incremental: any split of the input into update() calls gives the same value().
class ContentHash64 {
 public:
  void update(std::string_view bytes) {
    size_t i = 0;
    while (pending_n_ > 0 && pending_n_ < 8 && i < bytes.size())
      pending_ |= uint64_t(static_cast<unsigned char>(bytes[i++])) << (8 * pending_n_++);
    if (pending_n_ == 8) {
      h_ = (h_ ^ pending_) * kFnv1a64Prime;
      pending_ = 0;
      pending_n_ = 0;
    }
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t w = 0;
      for (int b = 0; b < 8; ++b)
        w |= uint64_t(static_cast<unsigned char>(bytes[i + b])) << (8 * b);
      h_ = (h_ ^ w) * kFnv1a64Prime;
    }
    for (; i < bytes.size(); ++i)
      pending_ |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * pending_n_++);
  }
  uint64_t value() const {
    uint64_t h = h_;
    for (int b = 0; b < pending_n_; ++b) h = (h ^ ((pending_ >> (8 * b)) & 0xFF)) * kFnv1a64Prime;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
  }

 private:
  uint64_t h_ = kFnv1a64Offset;
  uint64_t pending_ = 0;  // bytes of an incomplete 8-byte word, little-endian
  int pending_n_ = 0;
};

inline uint64_t content_hash64(std::string_view bytes) {
  ContentHash64 h;
  h.update(bytes);
  return h.value();
}

// FNV-1a 64 of raw bytes (no length prefix): fnv1a64("") == kFnv1a64Offset,
// fnv1a64("a") == 0xaf63dc4c8601ec8c (the published test vector).
inline uint64_t fnv1a64(std::string_view bytes) {
  Fnv1a64 h;
  h.update(bytes.data(), bytes.size());
  return h.value();
}

}  // namespace mllm
