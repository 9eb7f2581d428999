// The `bpe` tokenizer: a sentencepiece BPE model trained on the corpus, with byte fallback (no
// input is unknown) and the fixed special ids 0-3. Sentencepiece is reached only through the
// libmllm_spm module (spm_module/spm_api.h), found next to libmllm.so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mllm/data/tokenizer.h"

namespace mllm {

class BpeTokenizer : public Tokenizer {
 public:
  // From a serialized sentencepiece ModelProto. Throws DataError (naming `source`) when the
  // module rejects it or its special pieces are not <PAD> <UNK> <BOS> <EOS> at ids 0-3.
  BpeTokenizer(std::string model_proto, const std::string& source);
  ~BpeTokenizer() override;

  // Trains BPE (sentencepiece, model_type=bpe) on the lines of `documents` (newlines are never
  // inside a piece; they encode via byte fallback). Settings: identity normalization, no dummy
  // prefix, whitespace kept, byte_fallback, `vocab_size` as a soft limit (a small corpus yields
  // fewer pieces: a warning), and `character_coverage` (sentencepiece's meaning: the share of
  // character occurrences whose characters get their own piece; the rest are spelled with byte
  // pieces). 0 = automatic: 0.9995 (sentencepiece's advice for Chinese and Japanese), lowered
  // when those characters would take more than 3/4 of the vocabulary left after specials and the
  // 256 byte pieces, never below 0.98. `threads` is unused: the model file records the trainer's
  // thread count, so training always uses one to stay byte-identical.
  // Throws ConfigError for a coverage outside {0} u [0.98, 1]; DataError naming the smallest
  // vocab_size that works when the required characters + 256 bytes + 4 specials exceed
  // vocab_size, and with sentencepiece's message when training fails otherwise.
  static std::shared_ptr<BpeTokenizer> train(const std::vector<std::string>& documents,
                                             int64_t vocab_size, int threads,
                                             double character_coverage = 0);

  std::string type() const override { return "bpe"; }
  int64_t vocab_size() const override { return int64_t(piece_bytes_.size()); }
  std::vector<int32_t> encode(std::string_view utf8) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id) const override;
  void save(const std::string& path) const override;
  // FNV-1a 64 over "bpe" and the serialized model.
  uint64_t fingerprint() const override { return fingerprint_; }

  const std::string& model_proto() const { return model_proto_; }

 private:
  std::string model_proto_;
  void* handle_ = nullptr;                 // sentencepiece processor inside the module
  std::vector<std::string> piece_bytes_;   // id -> raw bytes (empty for specials)
  uint64_t fingerprint_ = 0;
};

// Path of the sentencepiece module that will be loaded: $MLLM_SPM_MODULE if set, else
// libmllm_spm.so in the folder of the loaded libmllm.so.
std::string spm_module_path();

// Registers "bpe" in tokenizer_registry() and tokenizer_loader_registry().
void register_bpe_tokenizer();

}  // namespace mllm
