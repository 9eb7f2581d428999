// Evaluating a trained model on any text (mllm-eval): loss, perplexity and bits per character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/data/tokenizer.h"
#include "mllm/distributed/communicator.h"
#include "mllm/model/model.h"

namespace mllm {

struct CorpusEvalResult {
  double loss = 0;           // mean cross-entropy per predicted token, nats
  double perplexity = 0;     // exp(loss)
  double bits_per_char = 0;  // summed cross-entropy / ln 2 / characters of the documents
  int64_t tokens = 0;        // predicted tokens (every stream token but the first)
  int64_t characters = 0;    // Unicode code points of the documents
  int64_t documents = 0;
  int64_t sequences = 0;     // windows evaluated, all ranks
};

// Collective over `comm`. The documents become one token stream as in a packed shard
// (BOS text EOS per document, data/shard.h), cut into windows of seq_len + 1 tokens that
// overlap by one (window i = stream[i * seq_len, (i + 1) * seq_len + 1), the last one padded with
// PAD targets), so every token after the first is predicted exactly once, with up to seq_len
// tokens of context. Windows go in batches of `batch`; rank r of W evaluates batches r, r + W,
// ... (the same batches at any world size, so the figures agree to float rounding). The model
// runs in eval mode on `device` without gradients. The loss counts every predicted token,
// EOS and the BOS that starts the next document included; bits per character divide the
// summed loss (in bits) by the documents' code points (ids the tokenizer maps to <UNK> still
// count their characters).
// Throws DataError when the documents hold no token to predict, Error for batch < 1 or
// seq_len outside [1, model.max_seq_len()].
CorpusEvalResult evaluate_corpus(LanguageModel& model, const Tokenizer& tokenizer,
                                 const std::vector<std::string>& documents, int64_t seq_len,
                                 int64_t batch, Communicator& comm, const torch::Device& device);

}  // namespace mllm
