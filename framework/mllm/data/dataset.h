// Training sequences over memory-mapped token shards (nothing is loaded up front), read as one
// stream: the shards of a split in order, as if they were one file.
//   packed   — window i = tokens[i*seq_len, i*seq_len + seq_len + 1) of the concatenated stream
//              (documents as BOS text EOS back to back); the standard pretraining layout. A
//              window may span two (or more) shards.
//   document — sequence i = document i as BOS text EOS, truncated to seq_len + 1 tokens and
//              right-padded with PAD (the reference notes' layout).
// Either way inputs = window[:-1] and targets = window[1:].
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mllm/data/shard.h"

namespace mllm {

class Tokenizer;

struct Batch {
  torch::Tensor inputs;   // [B, seq_len] int64 token ids
  torch::Tensor targets;  // [B, seq_len] int64; kPadId where there is no target (loss ignores)
};

class TokenDataset {
 public:
  // Opens the shards, in order (see ShardReader). `mode` is packed | document; seq_len >= 1.
  // Throws DataError naming the file for a bad shard or shards of different tokenizers, and
  // when the list is empty; ConfigError for a bad mode or seq_len.
  TokenDataset(const std::vector<std::string>& shard_paths, const std::string& mode,
               int64_t seq_len);
  TokenDataset(const std::string& shard_path, const std::string& mode, int64_t seq_len)
      : TokenDataset(std::vector<std::string>{shard_path}, mode, seq_len) {}

  // Number of sequences: packed floor((tokens - 1) / seq_len), document = documents.
  int64_t size() const { return size_; }
  int64_t seq_len() const { return seq_len_; }
  const std::string& mode() const { return mode_; }
  int64_t vocab_size() const { return int64_t(shards_[0]->header().vocab_size); }
  uint64_t tokenizer_fingerprint() const { return shards_[0]->header().tokenizer_fingerprint; }
  // Tokens in all shards (BOS/EOS included).
  int64_t token_count() const { return token_starts_.back(); }
  int64_t doc_count() const { return doc_starts_.back(); }
  int64_t shard_count() const { return int64_t(shards_.size()); }
  // The first shard's path; with several shards, "<first> (+N more)" (for messages).
  std::string path() const;

  // Throws DataError naming the (first) shard when it was not made by `tokenizer` (see
  // check_shard_tokenizer).
  void check_tokenizer(const Tokenizer& tokenizer) const;

  // Sequences `indices` (each in [0, size())) as a batch [indices.size(), seq_len] int64 on CPU.
  // Throws mllm::Error for an index out of range, DataError for a damaged shard.
  Batch get(const std::vector<int64_t>& indices) const;

 private:
  // Tokens [begin, begin + n) of the concatenated stream into out.
  void read_stream(int64_t begin, int64_t n, int64_t* out) const;
  // Start token of document d of the concatenated stream, d in [0, doc_count()].
  int64_t doc_offset(int64_t d) const;

  std::vector<std::shared_ptr<const ShardReader>> shards_;
  std::vector<int64_t> token_starts_;  // shard s holds stream tokens [starts[s], starts[s + 1])
  std::vector<int64_t> doc_starts_;    // and documents [doc_starts[s], doc_starts[s + 1])
  std::string mode_;
  int64_t seq_len_ = 0;
  int64_t size_ = 0;
  bool packed_ = true;
};

// Rows `ids` of a mixture of datasets (data.sources) as one batch, in the order of `ids`:
// global id g belongs to source s with offsets[s] <= g < offsets[s] + sources[s]->size() and
// stands for its sequence g - offsets[s] (MixtureSampler's ids). Throws mllm::Error for an id
// outside every source.
Batch get_mixture(const std::vector<std::unique_ptr<TokenDataset>>& sources,
                  const std::vector<int64_t>& offsets, const std::vector<int64_t>& ids);

}  // namespace mllm
