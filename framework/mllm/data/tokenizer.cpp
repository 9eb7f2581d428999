// Tokenizer registries, the tokenizer file container, and the streaming decoder.
#include "mllm/data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "mllm/data/atomic_file.h"
#include "mllm/data/bpe_tokenizer.h"
#include "mllm/data/char_tokenizer.h"
#include "mllm/data/hash.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {
constexpr const char* kTokenizerFormat = "mllm-tokenizer";
constexpr int kTokenizerVersion = 1;
}  // namespace

TokenizerRegistry& tokenizer_registry() {
  static TokenizerRegistry registry("tokenizer");
  return registry;
}

TokenizerLoaderRegistry& tokenizer_loader_registry() {
  static TokenizerLoaderRegistry registry("tokenizer");
  return registry;
}

void register_builtin_tokenizers() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_char_tokenizer();
    register_bpe_tokenizer();
  });
}

namespace {

constexpr uint64_t kSampleSeed = 0x5A3B1E5A3B1E5A3Bull;

class SampleTrainer : public TokenizerTrainer {
 public:
  SampleTrainer(int64_t sample_bytes, int threads, SampleTrain train)
      : budget_(std::max<int64_t>(0, sample_bytes)),
        heaps_(size_t(std::max(1, threads))),
        train_(std::move(train)) {}

  void add(int worker, std::string_view document) override {
    if (int64_t(document.size()) > budget_) return;  // never fits: never sampled
    Heap& h = heaps_.at(size_t(worker));
    const uint64_t rank = sample_rank(document);
    // Ranked at or after a document already dropped: outside the prefix, whenever it arrives.
    // (Without this, a document arriving after the drop of a better-ranked one could fit in the
    // freed bytes and be kept, so the sample depended on the order of arrival: issue 56.)
    if (rank >= h.cutoff) return;
    h.items.push_back({rank, std::string(document)});
    std::push_heap(h.items.begin(), h.items.end());
    h.bytes += int64_t(document.size());
    // Keep the longest prefix of the ranking that fits: drop the worst-ranked while over budget.
    // A dropped document d is outside the prefix for good (the documents ranked up to d already
    // exceed the budget), and so is everything ranked after it: the cutoff falls to d's rank.
    while (h.bytes > budget_) {
      std::pop_heap(h.items.begin(), h.items.end());
      h.bytes -= int64_t(h.items.back().text.size());
      h.cutoff = std::min(h.cutoff, h.items.back().rank);
      h.items.pop_back();
    }
  }

  bool supports_merge() const override { return true; }

  // Round 1: every rank's local prefix as (rank, bytes); every rank then knows how many of its
  // own items the global prefix takes (its first c, ties in rank order). Round 2: those texts.
  void merge(PrepareGroup& group) override {
    std::vector<Item> mine = local_prefix();
    std::string sizes;
    for (const auto& it : mine) {
      put_u64(sizes, it.rank);
      put_u64(sizes, it.text.size());
    }
    struct Entry {
      uint64_t rank;
      int owner;
      uint64_t bytes;
      bool operator<(const Entry& o) const {
        return rank != o.rank ? rank < o.rank : owner < o.owner;
      }
    };
    std::vector<Entry> all;
    const auto gathered = group.all_gather(sizes);
    for (size_t r = 0; r < gathered.size(); ++r) {
      WireReader in(gathered[r]);
      while (!in.done()) {
        const uint64_t rank = in.u64();
        all.push_back({rank, int(r), in.u64()});
      }
    }
    std::stable_sort(all.begin(), all.end());
    int64_t bytes = 0;
    size_t take = 0;
    std::vector<size_t> count(gathered.size(), 0);
    while (take < all.size() && bytes + int64_t(all[take].bytes) <= budget_) {
      bytes += int64_t(all[take].bytes);
      ++count[size_t(all[take++].owner)];
    }
    std::string texts;
    for (size_t i = 0; i < count[size_t(group.rank())]; ++i) {
      put_u64(texts, mine[i].rank);
      put_str(texts, mine[i].text);
    }
    mine.clear();
    merged_.clear();
    for (const auto& part : group.all_gather(texts)) {
      WireReader in(part);
      while (!in.done()) {
        const uint64_t rank = in.u64();
        merged_.push_back({rank, std::string(in.str())});
      }
    }
    std::stable_sort(merged_.begin(), merged_.end());
    is_merged_ = true;
  }

  std::shared_ptr<Tokenizer> finish() override {
    std::vector<Item> sample = is_merged_ ? std::move(merged_) : local_prefix();
    std::vector<std::string> docs;
    docs.reserve(sample.size());
    for (auto& it : sample) docs.push_back(std::move(it.text));
    return train_(docs);
  }

 private:
  struct Item {
    uint64_t rank;
    std::string text;
    // Equal ranks mean equal text (a 64-bit hash of it), so rank order is a total order of the
    // texts that does not depend on which worker or rank saw them.
    bool operator<(const Item& o) const { return rank < o.rank; }
  };
  struct Heap {
    std::vector<Item> items;  // max-heap by rank: every document seen ranked before `cutoff`
    int64_t bytes = 0;
    uint64_t cutoff = std::numeric_limits<uint64_t>::max();  // the best rank dropped so far
  };

  // Each worker's heap holds every document of its own ranked before its cutoff, a superset of
  // the prefix of its own documents; the prefix of the union is inside the union of those, and
  // is a function of the documents alone (not of their order or of which worker saw which).
  // Sorted by rank.
  std::vector<Item> local_prefix() {
    // A document one worker dropped ends the prefix for all: another worker may hold documents
    // ranked after it that it never had to drop. Below the smallest cutoff the union is whole.
    uint64_t cutoff = std::numeric_limits<uint64_t>::max();
    for (const auto& h : heaps_) cutoff = std::min(cutoff, h.cutoff);
    std::vector<Item> all;
    for (auto& h : heaps_)
      for (auto& it : h.items)
        if (it.rank < cutoff) all.push_back(std::move(it));
    heaps_.assign(heaps_.size(), Heap());
    std::stable_sort(all.begin(), all.end());
    int64_t bytes = 0;
    size_t keep = 0;
    while (keep < all.size() && bytes + int64_t(all[keep].text.size()) <= budget_)
      bytes += int64_t(all[keep++].text.size());
    all.resize(keep);
    return all;
  }

  int64_t budget_;
  std::vector<Heap> heaps_;
  SampleTrain train_;
  std::vector<Item> merged_;
  bool is_merged_ = false;
};

}  // namespace

void TokenizerTrainer::merge(PrepareGroup&) {
  throw Error("this tokenizer type cannot be trained by several ranks (TokenizerTrainer::merge)");
}

uint64_t sample_rank(std::string_view text) {
  uint64_t z = content_hash64(text) ^ kSampleSeed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::shared_ptr<TokenizerTrainer> make_sample_trainer(int64_t sample_bytes, int threads,
                                                      SampleTrain train) {
  return std::make_shared<SampleTrainer>(sample_bytes, threads, std::move(train));
}

std::shared_ptr<Tokenizer> train_tokenizer(const TokenizerConfig& config,
                                           const std::vector<std::string>& documents,
                                           int threads) {
  register_builtin_tokenizers();
  auto trainer = tokenizer_registry().create(config.type, config, std::max(1, threads));
  for (const auto& doc : documents) trainer->add(0, doc);
  return trainer->finish();
}

std::string fingerprint_hex(uint64_t fingerprint) { return fmt::format("{:016x}", fingerprint); }

void write_tokenizer_file(const std::string& path, const Tokenizer& tokenizer,
                          const std::string& payload) {
  nlohmann::ordered_json header = {
      {"format", kTokenizerFormat},
      {"version", kTokenizerVersion},
      {"type", tokenizer.type()},
      {"vocab_size", tokenizer.vocab_size()},
      {"fingerprint", fingerprint_hex(tokenizer.fingerprint())},
      {"payload_bytes", payload.size()},
  };
  AtomicFile f(path);
  f.write(header.dump());
  f.write("\n", 1);
  f.write(payload);
  f.commit();
}

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  register_builtin_tokenizers();
  const std::string bytes = read_file_bytes(path);
  const size_t eol = bytes.find('\n');
  nlohmann::json header;
  try {
    if (eol == std::string::npos) throw std::runtime_error("no header line");
    header = nlohmann::json::parse(bytes.substr(0, eol));
    if (!header.is_object() || header.value("format", "") != kTokenizerFormat)
      throw std::runtime_error("wrong format tag");
  } catch (const std::exception&) {
    throw DataError(fmt::format("'{}' is not an mllm tokenizer file (expected a first line "
                                "{{\"format\":\"{}\",...}}); re-run mllm-prepare to rebuild it",
                                path, kTokenizerFormat));
  }
  const int version = header.value("version", -1);
  if (version != kTokenizerVersion)
    throw DataError(fmt::format("tokenizer file '{}' has format version {}, this build reads {}; "
                                "re-run mllm-prepare",
                                path, version, kTokenizerVersion));
  const std::string type = header.value("type", "");
  const uint64_t payload_bytes = header.value("payload_bytes", uint64_t(0));
  const size_t have = bytes.size() - eol - 1;
  if (have != payload_bytes)
    throw DataError(fmt::format("tokenizer file '{}' is truncated or damaged: header says {} "
                                "payload bytes, file has {}",
                                path, payload_bytes, have));
  if (!tokenizer_loader_registry().contains(type))
    throw DataError(fmt::format("tokenizer file '{}' has type '{}', which no registered tokenizer "
                                "loads (known: {}); load the plugin that provides it",
                                path, type, fmt::join(tokenizer_loader_registry().names(), ", ")));
  auto tok = tokenizer_loader_registry().create(type, bytes.substr(eol + 1), path);
  const std::string want = header.value("fingerprint", "");
  if (fingerprint_hex(tok->fingerprint()) != want)
    throw DataError(fmt::format("tokenizer file '{}' is damaged: its content hashes to {}, the "
                                "header says {}",
                                path, fingerprint_hex(tok->fingerprint()), want));
  return tok;
}

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)) {
  MLLM_CHECK(tokenizer_ != nullptr, "IncrementalDecoder needs a tokenizer");
}

std::string IncrementalDecoder::push(int32_t id) {
  pending_ += tokenizer_->token_bytes(id);
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = utf8_replace_invalid(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8_replace_invalid(pending_);
  pending_.clear();
  return out;
}

}  // namespace mllm
