// Training sequences over a memory-mapped token shard (nothing is loaded up front):
//   packed   — window i = tokens[i*seq_len, i*seq_len + seq_len + 1) of the concatenated stream
//              (documents as BOS text EOS back to back); the standard pretraining layout.
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
  // Opens the shard (see ShardReader). `mode` is packed | document; seq_len >= 1.
  // Throws DataError naming the file for a bad shard, ConfigError for a bad mode or seq_len.
  TokenDataset(const std::string& shard_path, const std::string& mode, int64_t seq_len);

  // Number of sequences: packed floor((tokens - 1) / seq_len), document = documents.
  int64_t size() const { return size_; }
  int64_t seq_len() const { return seq_len_; }
  const std::string& mode() const { return mode_; }
  int64_t vocab_size() const { return int64_t(shard_->header().vocab_size); }
  uint64_t tokenizer_fingerprint() const { return shard_->header().tokenizer_fingerprint; }
  // Tokens in the shard (BOS/EOS included).
  int64_t token_count() const { return shard_->token_count(); }
  const std::string& path() const { return shard_->path(); }

  // Throws DataError naming the shard when it was not made by `tokenizer` (see
  // check_shard_tokenizer).
  void check_tokenizer(const Tokenizer& tokenizer) const;

  // Sequences `indices` (each in [0, size())) as a batch [indices.size(), seq_len] int64 on CPU.
  // Throws mllm::Error for an index out of range, DataError for a damaged shard.
  Batch get(const std::vector<int64_t>& indices) const;

 private:
  std::shared_ptr<const ShardReader> shard_;
  std::string mode_;
  int64_t seq_len_ = 0;
  int64_t size_ = 0;
  bool packed_ = true;
};

}  // namespace mllm
