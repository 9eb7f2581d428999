// The `char` tokenizer: one id per Unicode code point (decoded from UTF-8, never bytes), the
// vocabulary built from the training corpus by frequency. Ids 0-3 are the specials.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mllm/data/tokenizer.h"

namespace mllm {

class CharTokenizer : public Tokenizer {
 public:
  // Vocabulary = the 4 specials, then `chars` (id = 4 + index). Throws DataError on a
  // duplicate or invalid (surrogate, > U+10FFFF) code point.
  explicit CharTokenizer(std::vector<char32_t> chars);

  // Counts code points in `documents` (valid UTF-8) with `threads` workers and keeps those seen
  // at least `min_count` times, ordered by count descending, ties by code point ascending (so
  // the result does not depend on thread count or document order). `max_vocab` > 0 caps the
  // vocabulary, specials included. Throws ConfigError when 0 < max_vocab <= 4, DataError when
  // no character qualifies.
  static std::shared_ptr<CharTokenizer> train(const std::vector<std::string>& documents,
                                              int64_t min_count, int64_t max_vocab, int threads);
  // Restores from a tokenizer file payload (the vocabulary characters concatenated as UTF-8).
  // Throws DataError naming `path` when the payload is not valid UTF-8 or has duplicates.
  static std::shared_ptr<CharTokenizer> from_payload(const std::string& payload,
                                                     const std::string& path);

  std::string type() const override { return "char"; }
  int64_t vocab_size() const override { return kNumSpecialIds + int64_t(chars_.size()); }
  // Code points missing from the vocabulary and invalid UTF-8 bytes (one per maximal invalid
  // subpart) map to kUnkId.
  std::vector<int32_t> encode(std::string_view utf8) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id) const override;
  void save(const std::string& path) const override;
  // FNV-1a 64 over "char", then each vocabulary code point as 8 little-endian bytes.
  uint64_t fingerprint() const override { return fingerprint_; }

  // Non-special vocabulary in id order (id = 4 + index).
  const std::vector<char32_t>& chars() const { return chars_; }

 private:
  int32_t id_of(char32_t cp) const;

  std::vector<char32_t> chars_;
  std::vector<int32_t> bmp_ids_;  // code point < 0x10000 -> id (kUnkId when absent)
  std::unordered_map<char32_t, int32_t> astral_ids_;  // supplementary planes
  uint64_t fingerprint_ = 0;
};

// Registers "char" in tokenizer_registry() and tokenizer_loader_registry().
void register_char_tokenizer();

}  // namespace mllm
