// One optimizer step (Trainer::train_step): the micro-batches of this rank, gradient accumulation
// with the all-reduce of the last micro-step overlapping backward, clipping on synced gradients,
// the loss and stop vote in one small all-reduce, the non-finite check, AdamW and the lr; and
// train.sync_debug's phases around it. docs/ARCHITECTURE.md draws it line by line.
#include "mllm/train/trainer.h"

#include <limits>
#include <optional>
#include <thread>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/core/fault.h"
#include "mllm/core/logging.h"
#include "mllm/core/trace.h"
#include "mllm/data/atomic_file.h"
#include "mllm/model/loss.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/trainer_internal.h"

namespace mllm {
namespace {

// Clears autocast's cache when the scope ends, however it ends: the bf16 casts of the weights
// must not outlive the optimizer step that changes the weights.
struct AutocastCacheClearedAtExit {
  AutocastCacheClearedAtExit() = default;
  ~AutocastCacheClearedAtExit() { at::autocast::clear_cache(); }
  AutocastCacheClearedAtExit(const AutocastCacheClearedAtExit&) = delete;
  AutocastCacheClearedAtExit& operator=(const AutocastCacheClearedAtExit&) = delete;
};

}  // namespace

StepMetrics Trainer::train_step() {
  const Recipe& r = recipe_;
  const auto t_step = std::chrono::steady_clock::now();
  trace::Scope step_range(trace::active() ? fmt::format("step {}", state_.step + 1) : std::string());
  StepMetrics m;
  m.lr = schedule_->lr(state_.step);
  set_lr(*optimizer_, m.lr);

  sync_phase("data");
  std::vector<Batch> batches;
  int64_t local_targets = 0;
  {
    trace::Scope range("data loading");
    for (const auto& ids : sampler_->next_step()) {
      Batch batch = mixture_ ? get_mixture(source_data_, source_offsets_, ids) : train_data_->get(ids);
      local_targets += count_targets(batch.targets);
      batches.push_back(detail::to_device(std::move(batch), device_));
    }
  }
  int64_t global_targets = 0;
  const double scale = dp_->loss_scale(local_targets, &global_targets);
  MLLM_CHECK(global_targets > 0, "a global batch without any target token");

  dp_->wait_params();  // stage 1: the last step's all-gather, overlapped with the batch loading
  model_->train();
  optimizer_->zero_grad();
  if (dp_->zero_stage() >= 1) model_->zero_grad();  // the optimizer's tensors are the segments
  dp_->zero_grad();  // stage 2: a new accumulation into the gradient shards
  const int rank = comm_->rank();
  const int64_t this_step = state_.step + 1;
  set_current_step(this_step);
  const bool inject_nan = injected_fault("nan", rank, this_step).has_value();
  // Summed on the device in float64 (no host round trip per micro-step); on the CPU the same
  // additions in the same order as summing item<double>() values.
  torch::Tensor local_loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(device_));
  // bf16: autocast casts each weight to bf16 once per step, not once per micro-batch. Its cache
  // (casts of leaf tensors that require grad: the weights) lives until the last backward of the
  // step; the casts keep their autograd edge to the float32 weight, so every micro-batch's
  // gradient still reaches it. (Autocast caches nothing without grad mode, so a checkpointed
  // block's forward leaves no cast without that edge; e2e.bf16_steps.) Not at ZeRO stage 3:
  // there the casts of every block would stay for the whole step (half the model's bytes on
  // each rank), which is what stage 3 exists to avoid; each micro-batch casts again.
  const bool bf16 = r.train.precision == "bf16";
  const bool keep_casts = bf16 && r.dist.zero_stage < 3;
  std::optional<AutocastCacheClearedAtExit> clear_casts;
  if (keep_casts) clear_casts.emplace();
  for (std::size_t a = 0; a < batches.size(); ++a) {
    // Why: only the last micro-step all-reduces; earlier ones just accumulate locally. Stage 2
    // reduce-scatters every micro-step (no full-size gradient is kept between them).
    const bool last = a + 1 == batches.size();
    dp_->set_sync(last || dp_->zero_stage() >= 2);
    auto t0 = std::chrono::steady_clock::now();
    sync_phase("forward");
    torch::Tensor loss;
    dp_->pre_model_forward();  // stage 3: the embeddings and head gathered, block 0 on its way
    {
      trace::Scope range("forward");
      detail::Autocast autocast(bf16, device_, /*keep_cache=*/keep_casts);
      loss = model_->forward_loss(batches[a].inputs, batches[a].targets);
    }
    if (inject_nan && a == 0) loss = loss * std::numeric_limits<float>::quiet_NaN();
    m.forward_ms += detail::ms_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    sync_phase("backward");
    {
      trace::Scope range("backward");
      (loss * scale).backward();
    }
    m.backward_ms += detail::ms_since(t1);
    if (!last && dp_->zero_stage() >= 2) {
      const auto tc = std::chrono::steady_clock::now();
      sync_phase("gradient sync");
      trace::Scope range("wait for gradient sync");
      dp_->finish_gradient_sync();
      m.comm_ms += detail::ms_since(tc);
    }
    sync_phase("loss");
    local_loss_sum += loss.detach().to(torch::kFloat64);
  }
  clear_casts.reset();  // the step's last backward is done: the bf16 weight casts go
  if (injected_fault("throw", rank, this_step))
    throw Error(fmt::format("rank {}: step {}: injected failure (MLLM_FAULT throw)", rank, this_step));
  if (auto f = injected_fault("sleep", rank, this_step)) {
    spdlog::warn("rank {}: step {}: sleeping {} s (MLLM_FAULT sleep)", rank, this_step, f->seconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
  }
  auto t2 = std::chrono::steady_clock::now();
  sync_phase("gradient sync");
  {
    trace::Scope range("wait for gradient sync");
    dp_->finish_gradient_sync();
  }
  m.comm_ms += detail::ms_since(t2);
  sync_phase("gradient norm");
  m.grad_norm = dp_->clip_grad_norm(r.optim.grad_clip);
  sync_phase("loss and stop vote");

  // One small collective per step, before the update: the global loss sum and the stop votes
  // (a signal on any rank, the time limit on any rank), so every rank stops after the same
  // step, for one reason, and every rank sees the same loss when deciding about the update.
  const bool timed_out = r.train.time_limit_s && seconds_running() >= *r.train.time_limit_s;
  torch::Tensor red = torch::tensor(
      {local_loss_sum.item<double>(), stop_signal_received() ? 1.0 : 0.0, timed_out ? 1.0 : 0.0},
      torch::kFloat64);
  comm_->all_reduce(red, ReduceOp::kSum);
  if (red[1].item<double>() > 0) stop_reason_ = StopReason::kSignal;
  else if (red[2].item<double>() > 0) stop_reason_ = StopReason::kTimeLimit;
  m.loss = red[0].item<double>() / static_cast<double>(global_targets);
  if (auto f = injected_fault("skew", -1, this_step)) m.loss += f->by;  // reported value only

  // Identical on every rank (synced gradients, all-reduced loss), so all ranks decide alike,
  // before a non-finite update can reach the weights and a checkpoint.
  if (!std::isfinite(m.grad_norm) || !std::isfinite(m.loss)) {
    const std::string what = fmt::format("loss {} and gradient norm {} at step {}", m.loss,
                                         m.grad_norm, this_step);
    if (r.train.on_nonfinite == "stop")
      throw Error(fmt::format("{}; nothing was updated. Lower optim.lr (it may change on resume) "
                              "and resume from the last checkpoint, or set "
                              "train.on_nonfinite=skip", what));
    ++consecutive_skips_;
    ++state_.nonfinite_skips;
    if (consecutive_skips_ > r.train.max_nonfinite_skips)
      throw Error(fmt::format("{}: {} updates in a row were non-finite (train.max_nonfinite_skips"
                              "={}); the run has diverged. Lower optim.lr and resume from the "
                              "last checkpoint", what, consecutive_skips_,
                              r.train.max_nonfinite_skips));
    spdlog::warn("{}: update skipped on every rank (train.on_nonfinite=skip; {} in a row, {} in "
                 "the run)", what, consecutive_skips_, state_.nonfinite_skips);
    m.skipped = true;
  } else {
    consecutive_skips_ = 0;
    auto t3 = std::chrono::steady_clock::now();
    sync_phase("optimizer");
    trace::Scope range("optimizer");
    optimizer_->step();
    for (auto& cb : callbacks_) cb->on_optimizer_step_end(*this, this_step);
    dp_->all_gather_params();  // stage 1: every rank's updated slices into every replica
    m.optimizer_ms = detail::ms_since(t3);
  }
  if (injected_fault("desync", rank, this_step)) {
    dp_->wait_params();
    DataParallel::FullParams full(*dp_);
    torch::NoGradGuard no_grad;
    model_->parameters().front().add_(1e-3);
    spdlog::warn("rank {}: step {}: perturbed a parameter (MLLM_FAULT desync)", rank, this_step);
  }

  sync_phase("step end");
  state_.step += 1;
  state_.tokens += r.train.global_batch * r.data.seq_len;
  state_.sampler = sampler_->state();
  state_.lr = m.lr;
  if (mixture_) {
    for (size_t k = 0; k < r.data.sources.size(); ++k)
      m.source_tokens.emplace_back(r.data.sources[k].name, mixture_->drawn()[k] * r.data.seq_len);
    for (const auto& [source, epoch] : mixture_->take_new_epochs()) {
      const auto& name = r.data.sources[size_t(source)].name;
      spdlog::info("data source '{}' ran out at step {}: epoch {} of it begins (each epoch a new "
                   "order of its {} sequences)", name, state_.step, epoch,
                   source_data_[size_t(source)]->size());
      if (comm_->rank() == 0)
        write_metrics_line(nlohmann::json({{"step", state_.step},
                                           {"event", "source_epoch"},
                                           {"source", name},
                                           {"epoch", epoch}}).dump());
    }
  }
  m.step = state_.step;
  m.tokens = state_.tokens;
  m.target_tokens = global_targets;
  m.nonfinite_skips = state_.nonfinite_skips;
  m.step_ms = detail::ms_since(t_step);
  m.tokens_per_s = r.train.global_batch * r.data.seq_len / (m.step_ms / 1000.0);
  m.mfu = peak_flops_ > 0 ? flops_per_token_ * m.tokens_per_s / peak_flops_ : 0.0;
  flush_logs();  // so that a log file on a full disk fails now, not at exit
  if (const std::string e = log_write_error(); !e.empty()) throw Error(e);
  return m;
}

void Trainer::sync_phase(const char* phase) {
  if (sync_debug_) sync_debug_->set_phase(phase);
}

void Trainer::finish_sync_debug() {
  if (!sync_debug_ || !sync_debug_->active()) return;
  sync_debug_->stop();
  const nlohmann::json report = sync_debug_->report(sync_debug_steps_);
  spdlog::info("train.sync_debug: {} host synchronisation(s) in {} step(s) ({:.2f} per step) at {} "
               "place(s){}", report["total"].get<int64_t>(), sync_debug_steps_,
               report["per_step"].get<double>(), report["sites"].size(),
               report["sites"].empty() ? "" : ":");
  for (const auto& site : report["sites"])
    spdlog::info("  {:.2f} per step, {}: {} from {}", site["per_step"].get<double>(),
                 site["phase"].get<std::string>(),
                 site["op_frame"].get<std::string>().empty() ? "?" : site["op_frame"].get<std::string>(),
                 site["mllm_frame"].get<std::string>().empty() ? "?" : site["mllm_frame"].get<std::string>());
  if (comm_->rank() == 0) {
    nlohmann::json out = report;
    out["device"] = device_.str();
    write_file_atomic(run_dir_ + "/sync_debug.json", out.dump(1) + "\n");
  }
}

}  // namespace mllm
