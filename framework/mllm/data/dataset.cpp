// TokenDataset: packed windows / padded documents read from mmap'ed shards as one stream.
#include "mllm/data/dataset.h"

#include <fmt/format.h>

#include <algorithm>

#include "mllm/core/error.h"
#include "mllm/data/tokenizer.h"

namespace mllm {

TokenDataset::TokenDataset(const std::vector<std::string>& shard_paths, const std::string& mode,
                           int64_t seq_len)
    : mode_(mode), seq_len_(seq_len) {
  if (mode != "packed" && mode != "document")
    throw ConfigError(fmt::format("data.mode '{}' is not one of packed, document", mode));
  if (seq_len < 1) throw ConfigError(fmt::format("data.seq_len must be >= 1, got {}", seq_len));
  if (shard_paths.empty()) throw DataError("token dataset: no shard given; re-run mllm-prepare");
  token_starts_.push_back(0);
  doc_starts_.push_back(0);
  for (const auto& p : shard_paths) {
    auto shard = std::make_shared<const ShardReader>(p);
    if (!shards_.empty()) {
      const auto& a = shards_[0]->header();
      const auto& b = shard->header();
      if (a.tokenizer_fingerprint != b.tokenizer_fingerprint || a.vocab_size != b.vocab_size)
        throw DataError(fmt::format(
            "shards '{}' (tokenizer {}, vocab {}) and '{}' (tokenizer {}, vocab {}) were made by "
            "different tokenizers; re-run mllm-prepare",
            shards_[0]->path(), fingerprint_hex(a.tokenizer_fingerprint), a.vocab_size,
            shard->path(), fingerprint_hex(b.tokenizer_fingerprint), b.vocab_size));
    }
    token_starts_.push_back(token_starts_.back() + shard->token_count());
    doc_starts_.push_back(doc_starts_.back() + shard->doc_count());
    shards_.push_back(std::move(shard));
  }
  packed_ = mode == "packed";
  size_ = packed_ ? std::max<int64_t>(0, (token_count() - 1) / seq_len) : doc_count();
}

std::string TokenDataset::path() const {
  if (shards_.size() == 1) return shards_[0]->path();
  return fmt::format("{} (+{} more)", shards_[0]->path(), shards_.size() - 1);
}

void TokenDataset::check_tokenizer(const Tokenizer& tokenizer) const {
  check_shard_tokenizer(shards_[0]->header(), shards_[0]->path(), tokenizer);
}

void TokenDataset::read_stream(int64_t begin, int64_t n, int64_t* out) const {
  // The shard holding `begin`: the last start <= begin (empty shards are skipped over).
  size_t s = size_t(std::upper_bound(token_starts_.begin(), token_starts_.end(), begin) -
                    token_starts_.begin()) - 1;
  while (n > 0) {
    const int64_t local = begin - token_starts_[s];
    const int64_t take = std::min(n, shards_[s]->token_count() - local);
    if (take > 0) {
      shards_[s]->read_tokens(local, take, out);
      out += take;
      begin += take;
      n -= take;
    }
    ++s;
  }
}

int64_t TokenDataset::doc_offset(int64_t d) const {
  if (d == doc_count()) return token_count();
  const size_t s = size_t(std::upper_bound(doc_starts_.begin(), doc_starts_.end(), d) -
                          doc_starts_.begin()) - 1;
  return token_starts_[s] + shards_[s]->doc_offset(d - doc_starts_[s]);
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
                              i, size_, path(), mode_, seq_len_));
    if (packed_) {
      read_stream(i * seq_len_, w, window.data());
    } else {
      // A document never spans shards (mllm-prepare keeps documents whole).
      const int64_t begin = doc_offset(i);
      const int64_t n = std::min(w, doc_offset(i + 1) - begin);
      read_stream(begin, n, window.data());
      std::fill(window.begin() + n, window.end(), int64_t(kPadId));
    }
    std::copy(window.begin(), window.end() - 1, in + r * seq_len_);
    std::copy(window.begin() + 1, window.end(), tg + r * seq_len_);
  }
  return {inputs, targets};
}

Batch get_mixture(const std::vector<std::unique_ptr<TokenDataset>>& sources,
                  const std::vector<int64_t>& offsets, const std::vector<int64_t>& ids) {
  MLLM_CHECK(!sources.empty() && sources.size() == offsets.size(), "get_mixture: bad sources");
  const int64_t seq = sources[0]->seq_len();
  auto inputs = torch::empty({int64_t(ids.size()), seq}, torch::kInt64);
  auto targets = torch::empty({int64_t(ids.size()), seq}, torch::kInt64);
  std::vector<std::vector<int64_t>> rows(sources.size()), local(sources.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t g = ids[r];
    const auto s = size_t(std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin());
    if (s == 0 || g - offsets[s - 1] >= sources[s - 1]->size())
      throw Error(fmt::format("mixture sequence id {} is outside every source", g));
    rows[s - 1].push_back(int64_t(r));
    local[s - 1].push_back(g - offsets[s - 1]);
  }
  for (size_t s = 0; s < sources.size(); ++s) {
    if (rows[s].empty()) continue;
    const Batch part = sources[s]->get(local[s]);
    const auto where = torch::tensor(rows[s], torch::kInt64);
    inputs.index_copy_(0, where, part.inputs);
    targets.index_copy_(0, where, part.targets);
  }
  return {inputs, targets};
}

}  // namespace mllm
