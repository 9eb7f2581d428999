// Tokenizer registries, the tokenizer file container, and the streaming decoder.
#include "mllm/data/tokenizer.h"

#include <fmt/format.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "mllm/data/atomic_file.h"
#include "mllm/data/bpe_tokenizer.h"
#include "mllm/data/char_tokenizer.h"
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

std::shared_ptr<Tokenizer> train_tokenizer(const TokenizerConfig& config,
                                           const std::vector<std::string>& documents,
                                           int threads) {
  register_builtin_tokenizers();
  return tokenizer_registry().create(config.type, config, documents, std::max(1, threads));
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
