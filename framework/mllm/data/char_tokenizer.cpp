// Character-level tokenizer over Unicode code points, vocabulary ordered by corpus frequency.
#include "mllm/data/char_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "mllm/core/error.h"
#include "mllm/data/hash.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

constexpr char32_t kBmpEnd = 0x10000;

bool valid_scalar(char32_t cp) { return cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF); }

// Per-thread code point counts: a flat array for the BMP, a map for the rest.
struct Counts {
  std::vector<int64_t> bmp = std::vector<int64_t>(kBmpEnd, 0);
  std::unordered_map<char32_t, int64_t> astral;

  void count(std::string_view s) {
    size_t pos = 0;
    char32_t cp = 0;
    while (pos < s.size()) {
      const size_t n = utf8_decode_one(s, pos, cp);
      if (n == 0) {  // callers pass valid UTF-8; skip defensively rather than count garbage
        pos += utf8_invalid_length(s, pos);
        continue;
      }
      if (cp < kBmpEnd)
        ++bmp[cp];
      else
        ++astral[cp];
      pos += n;
    }
  }
};

}  // namespace

CharTokenizer::CharTokenizer(std::vector<char32_t> chars)
    : chars_(std::move(chars)), bmp_ids_(kBmpEnd, kUnkId) {
  Fnv1a64 h;
  h.update(std::string_view("char"));
  for (size_t i = 0; i < chars_.size(); ++i) {
    const char32_t cp = chars_[i];
    if (!valid_scalar(cp))
      throw DataError(fmt::format("char tokenizer: U+{:04X} is not a Unicode scalar value", uint32_t(cp)));
    if (id_of(cp) != kUnkId)
      throw DataError(fmt::format("char tokenizer: U+{:04X} appears twice in the vocabulary", uint32_t(cp)));
    const auto id = static_cast<int32_t>(kNumSpecialIds + i);
    if (cp < kBmpEnd)
      bmp_ids_[cp] = id;
    else
      astral_ids_[cp] = id;
    h.update_u64(cp);
  }
  fingerprint_ = h.value();
}

int32_t CharTokenizer::id_of(char32_t cp) const {
  if (cp < kBmpEnd) return bmp_ids_[cp];
  auto it = astral_ids_.find(cp);
  return it == astral_ids_.end() ? kUnkId : it->second;
}

namespace {

// The vocabulary from merged counts (rules of CharTokenizer::train).
std::shared_ptr<CharTokenizer> from_counts(Counts& total, int64_t min_count, int64_t max_vocab,
                                           int64_t documents) {
  std::vector<std::pair<int64_t, char32_t>> ranked;  // (count, code point)
  for (char32_t cp = 0; cp < kBmpEnd; ++cp)
    if (total.bmp[cp] >= min_count && total.bmp[cp] > 0) ranked.emplace_back(total.bmp[cp], cp);
  for (const auto& kv : total.astral)
    if (kv.second >= min_count) ranked.emplace_back(kv.second, kv.first);
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (max_vocab > 0 && int64_t(ranked.size()) > max_vocab - kNumSpecialIds)
    ranked.resize(size_t(max_vocab - kNumSpecialIds));
  if (ranked.empty())
    throw DataError(fmt::format("char tokenizer: no character occurs at least min_count = {} "
                                "times in the training corpus ({} documents); lower "
                                "data.tokenizer.min_count or add text",
                                min_count, documents));
  std::vector<char32_t> chars;
  chars.reserve(ranked.size());
  for (const auto& r : ranked) chars.push_back(r.second);
  return std::make_shared<CharTokenizer>(std::move(chars));
}

void check_max_vocab(int64_t max_vocab) {
  if (max_vocab > 0 && max_vocab <= kNumSpecialIds)
    throw ConfigError(fmt::format("data.tokenizer.max_vocab = {} leaves no room for characters "
                                  "after the {} specials; use 0 (no limit) or a value > {}",
                                  max_vocab, kNumSpecialIds, kNumSpecialIds));
}

// Streaming training: code point counts per worker, merged at the end (addition commutes, so
// the result does not depend on which worker saw which document).
class CharTrainer : public TokenizerTrainer {
 public:
  CharTrainer(int64_t min_count, int64_t max_vocab, int threads)
      : min_count_(min_count), max_vocab_(max_vocab), partial_(size_t(std::max(1, threads))),
        docs_(size_t(std::max(1, threads)), 0) {
    check_max_vocab(max_vocab);
  }
  void add(int worker, std::string_view document) override {
    partial_.at(size_t(worker)).count(document);
    ++docs_[size_t(worker)];
  }
  bool supports_merge() const override { return true; }
  // Every rank sends its non-zero counts; every rank sums all of them.
  void merge(PrepareGroup& group) override {
    sum_workers();
    std::string mine;
    put_u64(mine, uint64_t(docs_[0]));
    const Counts& c = partial_[0];
    auto put = [&](char32_t cp, int64_t n) {
      put_u64(mine, cp);
      put_u64(mine, uint64_t(n));
    };
    for (char32_t cp = 0; cp < kBmpEnd; ++cp)
      if (c.bmp[cp] != 0) put(cp, c.bmp[cp]);
    for (const auto& kv : c.astral) put(kv.first, kv.second);
    Counts total;
    int64_t docs = 0;
    for (const auto& part : group.all_gather(mine)) {
      WireReader in(part);
      docs += int64_t(in.u64());
      while (!in.done()) {
        const auto cp = char32_t(in.u64());
        const auto n = int64_t(in.u64());
        if (cp < kBmpEnd)
          total.bmp[cp] += n;
        else
          total.astral[cp] += n;
      }
    }
    partial_[0] = std::move(total);
    docs_[0] = docs;
  }
  std::shared_ptr<Tokenizer> finish() override {
    sum_workers();
    return from_counts(partial_[0], min_count_, max_vocab_, docs_[0]);
  }

 private:
  // Adds every worker's counts into worker 0's.
  void sum_workers() {
    Counts& total = partial_[0];
    for (size_t w = 1; w < partial_.size(); ++w) {
      for (char32_t cp = 0; cp < kBmpEnd; ++cp) total.bmp[cp] += partial_[w].bmp[cp];
      for (const auto& kv : partial_[w].astral) total.astral[kv.first] += kv.second;
      docs_[0] += docs_[w];
      partial_[w] = Counts();
      docs_[w] = 0;
    }
  }

  int64_t min_count_, max_vocab_;
  std::vector<Counts> partial_;
  std::vector<int64_t> docs_;
};

}  // namespace

std::shared_ptr<CharTokenizer> CharTokenizer::train(const std::vector<std::string>& documents,
                                                    int64_t min_count, int64_t max_vocab,
                                                    int threads) {
  const int n_workers = std::max(1, std::min<int>(threads, int(documents.size())));
  CharTrainer trainer(min_count, max_vocab, n_workers);
  std::vector<std::thread> workers;
  for (int w = 0; w < n_workers; ++w) {
    workers.emplace_back([&, w] {
      for (size_t i = size_t(w); i < documents.size(); i += size_t(n_workers))
        trainer.add(w, documents[i]);
    });
  }
  for (auto& t : workers) t.join();
  return std::static_pointer_cast<CharTokenizer>(trainer.finish());
}

std::shared_ptr<CharTokenizer> CharTokenizer::from_payload(const std::string& payload,
                                                           const std::string& path) {
  std::vector<char32_t> chars;
  size_t pos = 0;
  char32_t cp = 0;
  while (pos < payload.size()) {
    const size_t n = utf8_decode_one(payload, pos, cp);
    if (n == 0)
      throw DataError(fmt::format("char tokenizer file '{}': vocabulary is not valid UTF-8 at "
                                  "payload byte {}; re-run mllm-prepare",
                                  path, pos));
    chars.push_back(cp);
    pos += n;
  }
  try {
    return std::make_shared<CharTokenizer>(std::move(chars));
  } catch (const DataError& e) {
    throw DataError(fmt::format("char tokenizer file '{}': {}", path, e.what()));
  }
}

std::vector<int32_t> CharTokenizer::encode(std::string_view utf8) const {
  std::vector<int32_t> ids;
  ids.reserve(utf8.size() / 2 + 1);
  size_t pos = 0;
  char32_t cp = 0;
  while (pos < utf8.size()) {
    const size_t n = utf8_decode_one(utf8, pos, cp);
    if (n == 0) {
      ids.push_back(kUnkId);
      pos += utf8_invalid_length(utf8, pos);
      continue;
    }
    ids.push_back(id_of(cp));
    pos += n;
  }
  return ids;
}

std::string CharTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error(fmt::format("char tokenizer: token id {} is outside [0, {})", id, vocab_size()));
  std::string out;
  if (id >= kNumSpecialIds) utf8_append(out, chars_[size_t(id - kNumSpecialIds)]);
  return out;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 3);
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error(fmt::format("char tokenizer: token id {} is outside [0, {})", id, vocab_size()));
    if (id >= kNumSpecialIds) utf8_append(out, chars_[size_t(id - kNumSpecialIds)]);
  }
  return out;
}

void CharTokenizer::save(const std::string& path) const {
  std::string payload;
  for (char32_t cp : chars_) utf8_append(payload, cp);
  write_tokenizer_file(path, *this, payload);
}

void register_char_tokenizer() {
  tokenizer_registry().add("char", [](const TokenizerConfig& c, int threads) {
    return std::shared_ptr<TokenizerTrainer>(
        std::make_shared<CharTrainer>(c.min_count, c.max_vocab, threads));
  });
  tokenizer_loader_registry().add("char", [](const std::string& payload, const std::string& path) {
    return std::shared_ptr<Tokenizer>(CharTokenizer::from_payload(payload, path));
  });
}

}  // namespace mllm
