// TokenDataset: packed windows / padded documents read from an mmap'ed shard.
#include "mllm/data/dataset.h"

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/data/tokenizer.h"

namespace mllm {

TokenDataset::TokenDataset(const std::string& shard_path, const std::string& mode,
                           int64_t seq_len)
    : mode_(mode), seq_len_(seq_len) {
  if (mode != "packed" && mode != "document")
    throw ConfigError(fmt::format("data.mode '{}' is not one of packed, document", mode));
  if (seq_len < 1) throw ConfigError(fmt::format("data.seq_len must be >= 1, got {}", seq_len));
  shard_ = std::make_shared<const ShardReader>(shard_path);
  packed_ = mode == "packed";
  size_ = packed_ ? std::max<int64_t>(0, (shard_->token_count() - 1) / seq_len)
                  : shard_->doc_count();
}

void TokenDataset::check_tokenizer(const Tokenizer& tokenizer) const {
  check_shard_tokenizer(shard_->header(), shard_->path(), tokenizer);
}

Batch TokenDataset::get(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  const int64_t w = seq_len_ + 1;
  std::vector<int64_t> window(size_t(w), 0);
  auto inputs = torch::empty({b, seq_len_}, torch::kInt64);
  auto targets = torch::empty({b, seq_len_}, torch::kInt64);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = indices[size_t(r)];
    if (i < 0 || i >= size_)
      throw Error(fmt::format("sequence index {} is outside [0, {}) of '{}' ({} mode, seq_len {})",
                              i, size_, shard_->path(), mode_, seq_len_));
    if (packed_) {
      shard_->read_tokens(i * seq_len_, w, window.data());
    } else {
      const int64_t begin = shard_->doc_offset(i);
      const int64_t n = std::min(w, shard_->doc_offset(i + 1) - begin);
      shard_->read_tokens(begin, n, window.data());
      std::fill(window.begin() + n, window.end(), int64_t(kPadId));
    }
    std::copy(window.begin(), window.end() - 1, in + r * seq_len_);
    std::copy(window.begin() + 1, window.end(), tg + r * seq_len_);
  }
  return {inputs, targets};
}

}  // namespace mllm
