// Loss, perplexity and bits per character of a model on arbitrary text (see corpus_eval.h).
#include "mllm/train/corpus_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/core/special_tokens.h"
#include "mllm/model/loss.h"

namespace mllm {

namespace {
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // every byte that starts a character
  return n;
}
}  // namespace

CorpusEvalResult evaluate_corpus(LanguageModel& model, const Tokenizer& tokenizer,
                                 const std::vector<std::string>& documents, int64_t seq_len,
                                 int64_t batch, Communicator& comm, const torch::Device& device) {
  MLLM_CHECK(batch >= 1, "evaluate_corpus: batch must be >= 1");
  MLLM_CHECK(seq_len >= 1 && seq_len <= model.max_seq_len(),
             fmt::format("evaluate_corpus: seq_len {} outside [1, {}]", seq_len, model.max_seq_len()));
  CorpusEvalResult res;
  std::vector<int64_t> stream;
  for (const auto& doc : documents) {
    stream.push_back(kBosId);
    for (int32_t id : tokenizer.encode(doc)) stream.push_back(id);
    stream.push_back(kEosId);
    res.characters += code_points(doc);
  }
  res.documents = static_cast<int64_t>(documents.size());
  const int64_t n = static_cast<int64_t>(stream.size());
  if (n < 2) throw DataError("mllm-eval: the corpus holds no text to evaluate");
  const int64_t windows = (n - 1 + seq_len - 1) / seq_len;  // ceil((n - 1) / seq_len)
  const int64_t batches = (windows + batch - 1) / batch;
  const torch::Tensor all = torch::from_blob(stream.data(), {n}, torch::kLong);

  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0, tokens = 0;
  for (int64_t b = comm.rank(); b < batches; b += comm.world_size()) {
    const int64_t first = b * batch, rows = std::min(batch, windows - first);
    torch::Tensor inputs = torch::full({rows, seq_len}, static_cast<int64_t>(kPadId), torch::kLong);
    torch::Tensor targets = torch::full({rows, seq_len}, static_cast<int64_t>(kPadId), torch::kLong);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t start = (first + i) * seq_len;
      const int64_t len = std::min(seq_len, n - 1 - start);  // targets available in this window
      inputs[i].narrow(0, 0, len).copy_(all.narrow(0, start, len));
      targets[i].narrow(0, 0, len).copy_(all.narrow(0, start + 1, len));
    }
    tokens += static_cast<double>(count_targets(targets));
    loss_sum += model.forward_loss(inputs.to(device), targets.to(device)).item<double>();
  }
  if (was_training) model.train();
  torch::Tensor red = torch::tensor({loss_sum, tokens}, torch::kFloat64);
  comm.all_reduce(red, ReduceOp::kSum);
  loss_sum = red[0].item<double>();
  res.tokens = static_cast<int64_t>(red[1].item<double>());
  res.sequences = windows;
  if (res.tokens == 0) throw DataError("mllm-eval: the corpus holds no token to predict");
  res.loss = loss_sum / static_cast<double>(res.tokens);
  res.perplexity = std::exp(res.loss);
  res.bits_per_char = res.characters > 0 ? loss_sum / std::log(2.0) / static_cast<double>(res.characters)
                                         : std::numeric_limits<double>::quiet_NaN();
  return res;
}

}  // namespace mllm
