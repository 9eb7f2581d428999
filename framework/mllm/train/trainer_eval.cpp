// Evaluation and samples: the validation loss over eval.batches windows split across ranks (the
// same figure at any world size), and generated text from sample.prompts.
#include "mllm/train/trainer.h"

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/core/trace.h"
#include "mllm/model/generate.h"
#include "mllm/model/loss.h"
#include "mllm/train/trainer_internal.h"

namespace mllm {

EvalMetrics Trainer::evaluate() {
  trace::Scope range("eval");
  dp_->wait_params();
  // Stage 3: ranks may hold different numbers of val batches, and each forward's gathers are
  // collectives, so the weights are gathered once for the whole evaluation.
  DataParallel::FullParams full(*dp_);
  const Recipe& r = recipe_;
  torch::NoGradGuard no_grad;
  model_->eval();
  double sum = 0, count = 0;
  for (int64_t b : val_batches_of_rank(r.eval.batches, val_size_, r.train.micro_batch,
                                       comm_->rank(), comm_->world_size())) {
    Batch batch = val_get(val_batch_indices(val_size_, b, r.train.micro_batch));
    count += static_cast<double>(count_targets(batch.targets));
    batch = detail::to_device(std::move(batch), device_);
    detail::Autocast autocast(r.train.precision == "bf16", device_);
    sum += model_->forward_loss(batch.inputs, batch.targets).item<double>();
  }
  model_->train();
  torch::Tensor red = torch::tensor({sum, count}, torch::kFloat64);
  comm_->all_reduce(red, ReduceOp::kSum);
  EvalMetrics e;
  e.step = state_.step;
  e.tokens = static_cast<int64_t>(red[1].item<double>());
  if (e.tokens == 0)
    throw DataError("the validation shard has no sequences; raise data.val_fraction");
  e.val_loss = red[0].item<double>() / red[1].item<double>();
  e.val_ppl = std::exp(e.val_loss);
  if (std::isfinite(e.val_loss) && (!best_eval_ || e.val_loss < best_eval_->val_loss)) best_eval_ = e;
  // The same value on every rank: all stop here, before the checkpoint callback saves weights
  // that no longer produce finite losses.
  // (A NaN's sign bit depends on the kernels that made it: "nan" either way.)
  if (!std::isfinite(e.val_loss)) {
    const std::string value = std::isnan(e.val_loss) ? "nan" : fmt::format("{}", e.val_loss);
    throw Error(fmt::format("val loss is {} at step {}: the weights have diverged; this step is "
                            "not saved. Lower optim.lr (it may change on resume) and resume "
                            "from the last checkpoint", value, e.step));
  }
  for (auto& cb : callbacks_) cb->on_eval_end(*this, e);
  return e;
}

std::vector<std::string> Trainer::generate_samples() {
  trace::Scope range("samples");
  dp_->wait_params();
  DataParallel::FullParams full(*dp_);  // stage 3: decoding with a KV cache runs no block hooks
  if (comm_->rank() != 0) return {};
  const SampleConfig& s = recipe_.sample;
  torch::NoGradGuard no_grad;
  model_->eval();
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.prompts.size(); ++i) {
    std::vector<int64_t> prompt{kBosId};
    for (int32_t id : tokenizer_->encode(s.prompts[i])) prompt.push_back(id);
    GenerateOptions opt;
    opt.max_new_tokens = s.max_new_tokens;
    opt.temperature = s.temperature;
    opt.top_k = s.top_k;
    opt.top_p = s.top_p;
    opt.seed = static_cast<uint64_t>(recipe_.run.seed) + static_cast<uint64_t>(state_.step) + i;
    opt.eos_id = kEosId;
    auto ids = generate(*model_, prompt, opt);
    out.push_back(s.prompts[i] + tokenizer_->decode(std::vector<int32_t>(ids.begin(), ids.end())));
  }
  model_->train();
  return out;
}

Batch Trainer::val_get(const std::vector<int64_t>& positions) const {
  if (val_sources_.empty()) return val_data_->get(positions);
  std::vector<int64_t> offsets, ids;
  int64_t total = 0;
  for (int64_t n : val_source_sizes_) {
    offsets.push_back(total);
    total += n;
  }
  for (int64_t p : positions) ids.push_back(interleaved_ids(val_source_sizes_, p, 1).at(0));
  return get_mixture(val_sources_, offsets, ids);
}

}  // namespace mllm
