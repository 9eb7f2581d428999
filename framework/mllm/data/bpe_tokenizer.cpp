// BPE tokenizer over sentencepiece, called through the dlopen'ed libmllm_spm module (RTLD_LOCAL
// | RTLD_DEEPBIND keeps sentencepiece's bundled protobuf-lite away from LibTorch's libprotobuf).
#include "mllm/data/bpe_tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <filesystem>

#include "mllm/core/error.h"
#include "mllm/core/plugin.h"
#include "mllm/data/hash.h"
#include "mllm/data/spm_module/spm_api.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

// Function table of the loaded module.
struct SpmModule {
#define MLLM_SPM_MEMBER(name) mllm_spm_##name##_fn name = nullptr;
  MLLM_SPM_SYMBOLS(MLLM_SPM_MEMBER)
#undef MLLM_SPM_MEMBER
};

SpmModule load_module() {
  const std::string path = spm_module_path();
  void* dl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!dl)
    throw Error(fmt::format("bpe tokenizer: cannot load the sentencepiece module '{}': {}; build "
                            "the target mllm_spm (it is installed next to libmllm.so) or set "
                            "MLLM_SPM_MODULE to its path",
                            path, ::dlerror()));
  SpmModule m;
#define MLLM_SPM_RESOLVE(name)                                                             \
  m.name = reinterpret_cast<mllm_spm_##name##_fn>(::dlsym(dl, "mllm_spm_" #name));         \
  if (!m.name)                                                                             \
    throw Error(fmt::format("bpe tokenizer: module '{}' lacks symbol mllm_spm_" #name      \
                            "; it is from another mllm version, rebuild mllm_spm", path));
  MLLM_SPM_SYMBOLS(MLLM_SPM_RESOLVE)
#undef MLLM_SPM_RESOLVE
  if (m.api_version() != MLLM_SPM_API_VERSION)
    throw Error(fmt::format("bpe tokenizer: module '{}' has API version {}, expected {}; rebuild "
                            "mllm_spm",
                            path, m.api_version(), MLLM_SPM_API_VERSION));
  return m;  // the module stays loaded for the life of the process
}

const SpmModule& spm() {
  static const SpmModule module = load_module();
  return module;
}

void append_sink(void* ctx, const char* data, size_t n) {
  static_cast<std::string*>(ctx)->append(data, n);
}

void ids_sink(void* ctx, const char* data, size_t n) {
  auto* ids = static_cast<std::vector<int32_t>*>(ctx);
  const size_t old = ids->size();
  ids->resize(old + n / sizeof(int32_t));
  std::memcpy(ids->data() + old, data, n);
}

constexpr double kDefaultCoverage = 0.9995;  // sentencepiece's advice for CJK
constexpr double kMinCoverage = 0.98;        // sentencepiece refuses less
// The longest sentence given to sentencepiece's trainer, in bytes (its max_sentence_length; a
// longer line is fed in pieces: BpeTokenizer::train).
constexpr size_t kSentencePieceBytes = 4096;
constexpr int64_t kBytePieces = 256;

// Occurrence counts of the corpus's characters, most frequent first, and their total.
struct CharStats {
  std::vector<int64_t> counts;
  int64_t total = 0;
};

CharStats char_stats(const std::vector<const char*>& ptrs, const std::vector<size_t>& lens) {
  std::unordered_map<char32_t, int64_t> counts;
  CharStats st;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const std::string_view s(ptrs[i], lens[i]);
    char32_t cp = 0;
    for (size_t pos = 0; pos < s.size();) {
      const size_t n = utf8_decode_one(s, pos, cp);
      if (n == 0) {
        pos += utf8_invalid_length(s, pos);
        continue;
      }
      ++counts[cp];
      ++st.total;
      pos += n;
    }
  }
  st.counts.reserve(counts.size());
  for (const auto& kv : counts) st.counts.push_back(kv.second);
  std::sort(st.counts.begin(), st.counts.end(), std::greater<>());
  return st;
}

// The single-character pieces sentencepiece requires at `coverage`: it takes characters, most
// frequent first, until they cover `coverage` of all occurrences (trainer_interface.cc,
// required_chars_), and fails when they and the meta pieces (4 specials, 256 bytes) exceed
// vocab_size.
int64_t chars_required(const CharStats& st, double coverage) {
  int64_t covered = 0, n = 0;
  for (int64_t c : st.counts) {
    if (double(covered) / double(st.total) >= coverage) break;
    covered += c;
    ++n;
  }
  return n;
}

// Sentencepiece's default coverage is 0.9995 (its advice for CJK). With byte fallback rare
// characters can be spelled in bytes, so when that many characters would take more than 3/4 of
// the non-special, non-byte vocabulary (the rest is left for merges) the automatic coverage is
// lowered to what 3/4 holds, but not below 0.98, sentencepiece's minimum.
double auto_coverage(const CharStats& st, int64_t vocab_size) {
  const int64_t max_chars = std::max<int64_t>(1, (vocab_size - kNumSpecialIds - kBytePieces) * 3 / 4);
  if (int64_t(st.counts.size()) <= max_chars || st.total == 0) return kDefaultCoverage;
  int64_t covered = 0;
  for (int64_t i = 0; i < max_chars; ++i) covered += st.counts[size_t(i)];
  return std::clamp(double(covered) / double(st.total), kMinCoverage, kDefaultCoverage);
}

}  // namespace

std::string spm_module_path() { return libmllm_module_path("MLLM_SPM_MODULE", "libmllm_spm.so"); }

BpeTokenizer::BpeTokenizer(std::string model_proto, const std::string& source)
    : model_proto_(std::move(model_proto)) {
  const SpmModule& m = spm();
  std::string err;
  handle_ = m.load(model_proto_.data(), model_proto_.size(), append_sink, &err);
  if (!handle_)
    throw DataError(fmt::format("bpe tokenizer '{}': sentencepiece cannot read the model: {}; "
                                "re-run mllm-prepare",
                                source, err));
  const int32_t n = m.vocab_size(handle_);
  piece_bytes_.resize(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    if (m.piece_bytes(handle_, id, append_sink, &piece_bytes_[size_t(id)], append_sink, &err) != 0)
      throw DataError(fmt::format("bpe tokenizer '{}': piece {}: {}", source, id, err));
  }
  // Specials must be exactly the fixed ids; check them through encode-independent behaviour:
  // they produce no text, and the model must have room for them.
  if (n <= kNumSpecialIds)
    throw DataError(fmt::format("bpe tokenizer '{}': only {} pieces", source, n));
  for (int32_t id = 0; id < kNumSpecialIds; ++id)
    if (!piece_bytes_[size_t(id)].empty())
      throw DataError(fmt::format("bpe tokenizer '{}': id {} should be the special {} but is a "
                                  "text piece; this model was not made by mllm-prepare",
                                  source, id, kSpecialPieces[id]));
  Fnv1a64 h;
  h.update(std::string_view("bpe"));
  h.update(model_proto_);
  fingerprint_ = h.value();
}

BpeTokenizer::~BpeTokenizer() {
  if (handle_) spm().free(handle_);
}

// The end of the training sentence that begins at d[p], in a line ending at `end`: the line's
// end when the rest fits in kSentencePieceBytes, else after the last ' ' in the second half of
// that many bytes, else the last UTF-8 character boundary within them (the line is valid UTF-8:
// the reader checked it).
static size_t sentence_piece_end(const std::string& d, size_t p, size_t end) {
  if (end - p <= kSentencePieceBytes) return end;
  size_t cut = p + kSentencePieceBytes;
  const size_t space = d.rfind(' ', cut - 1);
  if (space != std::string::npos && space >= p + kSentencePieceBytes / 2) return space + 1;
  while (cut > p + 1 && (static_cast<unsigned char>(d[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::train(const std::vector<std::string>& documents,
                                                  int64_t vocab_size, int threads,
                                                  double character_coverage) {
  if (character_coverage != 0 && !(character_coverage >= kMinCoverage && character_coverage <= 1))
    throw ConfigError(fmt::format("data.tokenizer.character_coverage = {}: expected 0 (automatic) "
                                  "or a value in [{}, 1] (sentencepiece's range)",
                                  character_coverage, kMinCoverage));
  // Sentences = non-empty lines, pointing into `documents` (no copy). sentencepiece's trainer
  // skips, without a word, every sentence over max_sentence_length bytes (4,192 by default): a
  // corpus of long lines (web pages, code, books) would train on its short lines only, or fail
  // with "[!sentences_.empty()]" when it has none. So a longer line goes in as consecutive pieces
  // of at most kSentencePieceBytes, cut after the last ' ' of the piece's second half where
  // there is one (a word stays whole), else at a UTF-8 character boundary: every byte of the
  // sample is trained on.
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  int64_t lines = 0, long_lines = 0, sample_bytes = 0;
  for (const auto& d : documents) {
    size_t start = 0;
    while (start <= d.size()) {
      size_t end = d.find('\n', start);
      if (end == std::string::npos) end = d.size();
      if (end > start) {
        ++lines;
        sample_bytes += int64_t(end - start);
        if (end - start > kSentencePieceBytes) ++long_lines;
        for (size_t p = start; p < end;) {
          const size_t cut = sentence_piece_end(d, p, end);
          ptrs.push_back(d.data() + p);
          lens.push_back(cut - p);
          p = cut;
        }
      }
      start = end + 1;
    }
  }
  if (ptrs.empty()) throw DataError("bpe tokenizer: the training corpus has no text");
  spdlog::info("bpe tokenizer: training on the whole sample: {} document(s), {} line(s), {:.1f} MB"
               "{}", documents.size(), lines, double(sample_bytes) / 1e6,
               long_lines ? fmt::format(" ({} line(s) over {} bytes fed in {} pieces)", long_lines,
                                        kSentencePieceBytes,
                                        ptrs.size() - size_t(lines - long_lines))
                          : std::string());
  const CharStats stats = char_stats(ptrs, lens);
  const bool automatic = character_coverage == 0;
  const double coverage = automatic ? auto_coverage(stats, vocab_size) : character_coverage;
  if (automatic && coverage < kDefaultCoverage)
    spdlog::info("bpe tokenizer: vocab_size {} is too small for {:.4g}% character coverage; "
                 "using {:.4f}% (the rarest characters are spelled with byte pieces)",
                 vocab_size, 100 * kDefaultCoverage, 100 * coverage);
  const int64_t needed = chars_required(stats, coverage) + kNumSpecialIds + kBytePieces;
  if (needed > vocab_size)
    throw DataError(fmt::format(
        "bpe tokenizer: data.tokenizer.vocab_size = {} is too small for this corpus: {} of its {} "
        "distinct characters cover {:.4g}% of the text (data.tokenizer.character_coverage{}) and "
        "each needs its own piece, plus {} byte pieces and {} specials. The smallest vocab_size "
        "that works is {}{}",
        vocab_size, needed - kNumSpecialIds - kBytePieces, stats.counts.size(), 100 * coverage,
        automatic ? fmt::format(" is automatic, at least {}", kMinCoverage) : "", kBytePieces,
        static_cast<int64_t>(kNumSpecialIds), needed,
        coverage > kMinCoverage
            ? fmt::format("; or lower data.tokenizer.character_coverage (0.98 needs {})",
                          chars_required(stats, kMinCoverage) + kNumSpecialIds + kBytePieces)
            : ""));
  const std::vector<std::pair<std::string, std::string>> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", fmt::format("{:.9g}", coverage)},
      {"pad_id", std::to_string(kPadId)},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_piece", kSpecialPieces[kPadId]},
      {"unk_piece", kSpecialPieces[kUnkId]},
      {"bos_piece", kSpecialPieces[kBosId]},
      {"eos_piece", kSpecialPieces[kEosId]},
      {"unk_surface", ""},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"input_sentence_size", "0"},  // all sentences: no random sampling
      // Every sentence is at most kSentencePieceBytes (above): none is skipped for its length.
      {"max_sentence_length", std::to_string(kSentencePieceBytes)},
      // The model file records num_threads; a fixed value keeps it byte-identical whatever the
      // thread count (sentencepiece's BPE merge loop is single-threaded anyway).
      {"num_threads", "1"},
  };
  std::vector<const char*> keys, values;
  for (const auto& kv : options) {
    keys.push_back(kv.first.c_str());
    values.push_back(kv.second.c_str());
  }
  std::string model, err;
  if (spm().train(ptrs.data(), lens.data(), ptrs.size(), keys.data(), values.data(), keys.size(),
                  append_sink, &model, append_sink, &err) != 0)
    throw DataError(fmt::format("bpe tokenizer: sentencepiece training failed: {} (our keys: "
                                "data.tokenizer.vocab_size, data.tokenizer.character_coverage)",
                                err));
  auto tokenizer = std::make_shared<BpeTokenizer>(std::move(model), "<trained>");
  if (tokenizer->vocab_size() < vocab_size)
    spdlog::warn("bpe tokenizer: training gave {} ids, fewer than data.tokenizer.vocab_size = {} "
                 "(the corpus has no more merges to learn); the model uses {}",
                 tokenizer->vocab_size(), vocab_size, tokenizer->vocab_size());
  return tokenizer;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view utf8) const {
  std::vector<int32_t> ids;
  std::string err;
  if (spm().encode(handle_, utf8.data(), utf8.size(), ids_sink, &ids, append_sink, &err) != 0)
    throw Error("bpe tokenizer: encoding failed: " + err);
  return ids;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error(fmt::format("bpe tokenizer: token id {} is outside [0, {})", id, vocab_size()));
  return piece_bytes_[size_t(id)];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error(fmt::format("bpe tokenizer: token id {} is outside [0, {})", id, vocab_size()));
    bytes += piece_bytes_[size_t(id)];
  }
  return utf8_replace_invalid(bytes);
}

void BpeTokenizer::save(const std::string& path) const {
  write_tokenizer_file(path, *this, model_proto_);
}

void register_bpe_tokenizer() {
  tokenizer_registry().add("bpe", [](const TokenizerConfig& c, int threads) {
    // Sentencepiece trains on text in memory: a bounded, deterministic sample of the corpus.
    return make_sample_trainer(c.sample_bytes, threads, [c](const std::vector<std::string>& docs) {
      return std::shared_ptr<Tokenizer>(
          BpeTokenizer::train(docs, c.vocab_size, 1, c.character_coverage));
    });
  });
  tokenizer_loader_registry().add("bpe", [](const std::string& payload, const std::string& path) {
    return std::shared_ptr<Tokenizer>(std::make_shared<BpeTokenizer>(payload, path));
  });
}

}  // namespace mllm
