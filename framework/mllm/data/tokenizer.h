// The tokenizer interface, its registries (train by `data.tokenizer.type`, load by the type
// stored in the file), the tokenizer file container, and streaming decode for generation.
// Special ids are fixed for every tokenizer: <PAD>=0 <UNK>=1 <BOS>=2 <EOS>=3.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"
#include "mllm/core/special_tokens.h"
#include "mllm/data/prepare_group.h"

namespace mllm {

inline constexpr int32_t kNumSpecialIds = 4;
// Names of the special ids, index = id. Text equal to these is ordinary text, never a special.
inline constexpr const char* kSpecialPieces[kNumSpecialIds] = {"<PAD>", "<UNK>", "<BOS>", "<EOS>"};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Registry name of this tokenizer ("char", "bpe").
  virtual std::string type() const = 0;
  // Number of ids, specials included: every id is in [0, vocab_size).
  virtual int64_t vocab_size() const = 0;
  // Token ids of UTF-8 text, no BOS/EOS added. Text that cannot be represented maps to kUnkId
  // (char: unknown characters and invalid UTF-8 bytes; bpe never, thanks to byte fallback).
  virtual std::vector<int32_t> encode(std::string_view utf8) const = 0;
  // Text of `ids`; specials (ids 0-3) produce no text. Throws mllm::Error for an id outside
  // [0, vocab_size).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Raw bytes id `id` stands for: possibly part of a UTF-8 character (bpe byte pieces), empty
  // for specials. decode(ids) equals the concatenation, with invalid UTF-8 replaced by U+FFFD.
  // Default: decode({id}). Throws mllm::Error for an id outside [0, vocab_size).
  virtual std::string token_bytes(int32_t id) const { return decode({id}); }
  // Writes the tokenizer file (see write_tokenizer_file) atomically. Throws mllm::Error on I/O.
  virtual void save(const std::string& path) const = 0;
  // Stable 64-bit hash of everything that decides the id mapping (type + vocabulary / model).
  // Stored in every shard and checkpoint; equal fingerprints mean identical tokenization.
  virtual uint64_t fingerprint() const = 0;
};

// Builds a tokenizer from a stream of training documents (valid UTF-8): the train split,
// streamed by mllm-prepare in bounded memory (data.md). A trainer keeps what it needs (char:
// counts; bpe: a bounded sample), never the whole corpus.
class TokenizerTrainer {
 public:
  virtual ~TokenizerTrainer() = default;
  // Feeds one document. `worker` is in [0, threads) of the factory call: calls with different
  // workers may run at the same time, calls with one worker never do. Documents arrive in no
  // particular order, and the result must not depend on it (nor on the thread count).
  virtual void add(int worker, std::string_view document) = 0;
  // Distributed preparation: whether merge() is implemented. When it is not, a preparation of
  // several ranks feeds every train document to rank 0's trainer alone (slower, same result).
  virtual bool supports_merge() const { return false; }
  // Called once on every rank of `group`, after that rank's last add(): exchanges what the
  // ranks added (through group.all_gather), so that finish() on rank 0 gives the tokenizer of
  // all ranks' documents, the same as one trainer fed all of them. Throws mllm::Error by default.
  virtual void merge(PrepareGroup& group);
  // The trained tokenizer, once every document was added (and merged). Throws ConfigError for
  // bad settings, DataError when the documents cannot produce a vocabulary.
  virtual std::shared_ptr<Tokenizer> finish() = 0;
};

// Training factories: (tokenizer section, worker threads) -> a trainer, registered under the name
// used in `data.tokenizer.type`.
using TokenizerRegistry = Registry<TokenizerTrainer, const TokenizerConfig&, int /*threads*/>;
TokenizerRegistry& tokenizer_registry();

// A trainer that keeps a deterministic sample of the documents and then calls
// `train(sample)` (for tokenizers that train on text in memory, like bpe; a plugin can use it
// too). The sample: every document of at most `sample_bytes` bytes is ranked by
// sample_rank(text), and the sample is the longest prefix of that ranking whose bytes sum to at
// most `sample_bytes` (the whole corpus when it fits), handed to `train` in ranking order.
// Documents of equal rank have equal text, so the sample does not depend on thread count,
// arrival order or the ranks that saw them. Memory: at most `threads` x sample_bytes bytes of
// text while adding; merge() moves only the sampled text (sample_bytes in all) to every rank.
using SampleTrain = std::function<std::shared_ptr<Tokenizer>(const std::vector<std::string>&)>;
std::shared_ptr<TokenizerTrainer> make_sample_trainer(int64_t sample_bytes, int threads,
                                                      SampleTrain train);
// The sample ranking: splitmix64's finaliser of content_hash64(text) ^ 0x5A3B1E5A3B1E5A3B.
uint64_t sample_rank(std::string_view text);

// Loading factories: (payload of a tokenizer file, file path for messages), registered under the
// same name. A tokenizer plugin registers one of each.
using TokenizerLoaderRegistry =
    Registry<Tokenizer, const std::string& /*payload*/, const std::string& /*path*/>;
TokenizerLoaderRegistry& tokenizer_loader_registry();

// Registers char and bpe in both registries. Safe to call more than once.
void register_builtin_tokenizers();

// Trains the tokenizer `config.type` on `documents` (in memory). Throws
// ConfigError for an unknown type or bad settings, DataError when the corpus cannot produce a
// vocabulary.
std::shared_ptr<Tokenizer> train_tokenizer(const TokenizerConfig& config,
                                           const std::vector<std::string>& documents,
                                           int threads = 1);

// Loads a tokenizer file of any registered type. Throws DataError naming `path` when it is
// missing, not a tokenizer file, truncated, of an unknown type, or fails its fingerprint check.
std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Tokenizer file: one JSON header line
//   {"format":"mllm-tokenizer","version":1,"type":T,"vocab_size":V,"fingerprint":"<16 hex>",
//    "payload_bytes":N}\n
// followed by N payload bytes owned by the type (char: the vocabulary; bpe: the sentencepiece
// model). Written to a temporary name and renamed. Throws mllm::Error on I/O failure.
void write_tokenizer_file(const std::string& path, const Tokenizer& tokenizer,
                          const std::string& payload);

// Streams generated ids as text, never splitting a UTF-8 character: push() returns the text that
// became complete with this id (often empty for a bpe byte piece), flush() the rest (a dangling
// partial character becomes U+FFFD). Specials produce no text.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string pending_;  // bytes of an incomplete character
};

// "%016x" of a fingerprint, as written in files and messages.
std::string fingerprint_hex(uint64_t fingerprint);

}  // namespace mllm
