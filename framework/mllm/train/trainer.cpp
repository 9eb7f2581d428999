// The trainer's run: construction, the loop over optimizer steps with its callbacks and stops,
// checkpoints, the run summary and the replica check. Its other parts: trainer_build.cpp (building
// a run from the recipe), trainer_resume.cpp (whether and from where to resume, and restoring),
// train_step.cpp (one optimizer step), trainer_eval.cpp (evaluation and samples).
#include "mllm/train/trainer.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <unordered_map>

#include <zlib.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/core/fault.h"
#include "mllm/core/logging.h"
#include "mllm/core/plugin.h"
#include "mllm/core/trace.h"
#include "mllm/data/atomic_file.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/builtins.h"
#include "mllm/train/device.h"
#include "mllm/train/tensorboard.h"
#include "mllm/train/trainer_internal.h"

namespace fs = std::filesystem;

namespace mllm {

namespace detail {

void drop_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string keep;
  bool dropped = false;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || (j.contains("step") && j["step"].get<int64_t>() > step)) dropped = true;
    else keep += line + "\n";
  }
  in.close();
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  try {
    write_file_checked(tmp, keep);
    if (read_file_bytes(tmp) != keep)
      throw Error("cannot write " + tmp + ": the file read back differs from what was written");
    fs::rename(tmp, path);  // atomic: a crash leaves the old file or the new one
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error(fmt::format("cannot rewrite {} (dropping the lines after step {}, which this run "
                            "replays): {}; the file is unchanged", path, step, e.what()));
  }
}

}  // namespace detail

void check_component_names(const Recipe& r, const std::vector<std::string>& overrides) {
  auto check = [&](const auto& registry, const std::string& name, const std::string& key) {
    try {
      registry.require(name);
    } catch (const ConfigError& e) {
      // Blame the override that set the key, if one did (the last one wins, as when composing).
      std::string where = r.source;
      for (const auto& ov : overrides)
        if (ov.rfind(key + "=", 0) == 0) where = "<command line> " + ov;
      throw ConfigError(where + ": " + key + ": " + e.what());
    }
  };
  check(tokenizer_registry(), r.data.tokenizer.type, "data.tokenizer.type");
  check(model_registry(), r.model.type, "model.type");
  check(optimizer_registry(), r.optim.type, "optim.type");
  check(lr_schedule_registry(), r.schedule.type, "schedule.type");
  for (const auto& name : r.callbacks) check(callback_registry(), name, "callbacks");
}

const char* to_string(StopReason r) {
  switch (r) {
    case StopReason::kMaxSteps: return "reached train.max_steps";
    case StopReason::kStopAtStep: return "reached train.stop_at_step";
    case StopReason::kTimeLimit: return "reached train.time_limit_s";
    case StopReason::kSignal: return "received a stop signal (SIGTERM/SIGINT/SIGUSR1/SIGUSR2)";
  }
  return "?";
}

int resolve_threads(int64_t threads, int local_size, int usable, const char* omp_num_threads) {
  if (threads > 0) return static_cast<int>(threads);
  if (omp_num_threads != nullptr) {
    char* end = nullptr;
    const long n = std::strtol(omp_num_threads, &end, 10);
    if (end != omp_num_threads && *end == '\0' && n > 0) return static_cast<int>(n);
  }
  return std::max(1, usable / std::max(1, local_size));
}

int resolve_threads(int64_t threads, int local_size) {
  const int usable = usable_cpus();
  const int n = resolve_threads(threads, local_size, usable, std::getenv("OMP_NUM_THREADS"));
  if (threads > 0 && static_cast<int64_t>(n) * local_size > usable)
    spdlog::warn("train.threads={} x {} rank(s) on this node = {} threads on {} usable CPU(s) "
                 "(affinity and cgroup quota): oversubscribed, which is slower; use "
                 "train.threads=auto", n, local_size, n * local_size, usable);
  return n;
}

Trainer::Trainer(Recipe recipe, std::shared_ptr<Communicator> comm)
    : recipe_(std::move(recipe)), comm_(std::move(comm)), start_(std::chrono::steady_clock::now()) {
  validate_for_world(recipe_, comm_->world_size());
  injected_fault("", -1, -1);  // a malformed MLLM_FAULT fails now, before anything is written
  register_builtins();
  load_plugins(recipe_.plugins);  // before anything is built: plugins may provide any part
  check_component_names(recipe_);
  run_dir_ = recipe_.run.out_dir;
  build();
}

Trainer::~Trainer() {
  // The hooks point at dp_, which goes before a model that someone else may still hold.
  if (model_) model_->set_block_hooks(nullptr);
}

void Trainer::log_summary(int64_t first_step, int64_t first_tokens) const {
  const double wall = seconds_running(), total = elapsed_at_start_s_ + wall;
  std::string text = fmt::format(
      "run summary: step {}/{} ({} steps, {} tokens in this invocation; {} tokens in all) | "
      "wall time {}", state_.step, recipe_.train.max_steps, state_.step - first_step,
      state_.tokens - first_tokens, state_.tokens, format_duration(wall));
  if (first_step > 0) text += fmt::format(" ({} with the earlier invocations)", format_duration(total));
  if (std::isfinite(last_train_loss_))
    text += fmt::format(" | final train loss {:.4f} (ppl {:.2f})", last_train_loss_,
                        std::exp(last_train_loss_));
  if (best_eval_)
    text += fmt::format(" | best val loss {:.4f} (ppl {:.2f}) at step {}", best_eval_->val_loss,
                        best_eval_->val_ppl, best_eval_->step);
  text += last_saved_step_ >= 0
              ? " | last checkpoint " + checkpoints_dir() + "/" + checkpoint_name(last_saved_step_)
              : " | no checkpoint saved";
  spdlog::info("{}", text);
}

double Trainer::seconds_running() const {
  return detail::ms_since(start_) / 1000.0;
}

StopReason Trainer::run() {
  const Recipe& r = recipe_;
  const int64_t first_step = state_.step, first_tokens = state_.tokens;
  if (state_.step >= r.train.max_steps && comm_->rank() == 0)
    spdlog::warn("the run is already at step {}, not below train.max_steps={}: nothing to train "
                 "(raise train.max_steps to continue it)", state_.step, r.train.max_steps);
  for (auto& cb : callbacks_) cb->on_train_begin(*this);
  StopReason reason = StopReason::kMaxSteps;
  while (state_.step < r.train.max_steps) {
    if (r.train.stop_at_step && state_.step >= *r.train.stop_at_step) {
      reason = StopReason::kStopAtStep;
      break;
    }
    if (r.train.sync_debug && !sync_debug_ && state_.step == first_step + 1) {
      // After one step: the first one's set-up (allocations, cuBLAS handles, the data cache)
      // synchronises as it must; what is left is what every step pays.
      sync_debug_ = std::make_unique<SyncDebug>();
      if (!sync_debug_->start(device_.is_cuda()))
        throw ConfigError(fmt::format("{}: train.sync_debug needs a LibTorch built with CUDA",
                                      r.source));
      spdlog::info("train.sync_debug: counting host synchronisations from step {} on{}",
                   state_.step + 1, device_.is_cuda() ? "" : " (none on the CPU: the report will be empty)");
    }
    StepMetrics m;
    try {
      m = train_step();
    } catch (const CommError& e) {
      // A failed collective: say in which step (the message names the rank). A timed-out one
      // aborts the job from the helper thread, with the step (core/error.h current_step).
      throw CommError(fmt::format("step {}: {}", state_.step + 1, e.what()));
    }
    // Replicas compared before the callbacks: a drifted rank 0 must not be saved.
    if (r.dist.check_every_steps > 0 && state_.step % r.dist.check_every_steps == 0 &&
        comm_->world_size() > 1)
      check_replicas();
    if (!m.skipped) last_train_loss_ = m.loss;
    if (sync_debug_) ++sync_debug_steps_;
    sync_phase("callbacks");
    for (auto& cb : callbacks_) cb->on_step_end(*this, m);
    sync_phase("");
    if (stop_reason_) {
      reason = *stop_reason_;
      break;
    }
  }
  if (reason == StopReason::kMaxSteps && r.train.stop_at_step &&
      state_.step >= *r.train.stop_at_step && state_.step < r.train.max_steps)
    reason = StopReason::kStopAtStep;
  finish_sync_debug();
  spdlog::info("stopping at step {}: {}", state_.step, to_string(reason));
  // An early stop always leaves a checkpoint to resume from, whatever callbacks are listed.
  if (reason != StopReason::kMaxSteps) save_checkpoint();
  for (auto& cb : callbacks_) cb->on_train_end(*this, reason);
  log_summary(first_step, first_tokens);
  flush_logs();
  if (const std::string e = log_write_error(); !e.empty()) throw Error(e);
  return reason;
}

LanguageModel& Trainer::model() {
  if (dp_) dp_->wait_params();
  return *model_;
}

std::string Trainer::save_checkpoint() {
  dp_->wait_params();
  const std::string folder = checkpoints_dir() + "/" + checkpoint_name(state_.step);
  if (last_saved_step_ == state_.step) return folder;
  trace::Scope range("checkpoint");
  // Stage 3: model.pt holds the whole model, so every rank gathers it for the save.
  DataParallel::FullParams full(*dp_);
  // Weights that are no longer finite are never saved (the same verdict on every rank: the
  // replicas are identical), so `latest` always holds a usable model.
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model_->named_parameters())
      if (!torch::isfinite(p.value()).all().item<bool>())
        throw Error(fmt::format("parameter {} is not finite at step {}: the weights have "
                                "diverged and are not saved. Lower optim.lr (it may change on "
                                "resume) and resume from the last checkpoint", p.key(),
                                state_.step));
  }
  state_.elapsed_s = elapsed_at_start_s_ + seconds_running();
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<OptimizerPiece> pieces =
      dp_->zero_stage() >= 1 ? optimizer_pieces() : std::vector<OptimizerPiece>{};
  std::string out = mllm::save_checkpoint(*comm_, checkpoints_dir(), state_, *model_,
                                          *optimizer_, to_yaml(recipe_), tokenizer_path_,
                                          recipe_.checkpoint.keep_last,
                                          dp_->zero_stage() >= 1 ? &pieces : nullptr,
                                          dp_->zero_stage());
  last_saved_step_ = state_.step;
  spdlog::info("saved checkpoint {} ({:.0f} ms)", out, detail::ms_since(t0));
  return out;
}

void Trainer::write_metrics_line(const std::string& json_line) {
  if (!metrics_) return;
  // A failed write can leave a partial line behind; the next start drops it (drop_metrics_after).
  metrics_->write(json_line + "\n");
  if (tensorboard_) tensorboard_->add_metrics(nlohmann::json::parse(json_line));
}

void Trainer::write_text(const std::string& tag, const std::string& text) {
  if (tensorboard_) tensorboard_->add_text(tag, text, state_.step);
}

void Trainer::check_replicas() {
  dp_->wait_params();
  DataParallel::FullParams full(*dp_);  // stage 3: the blocks as gathered from every rank's shard
  // Names and tensors in a fixed order: parameters, then each parameter's optimizer state.
  std::vector<std::string> names;
  std::vector<torch::Tensor> tensors;
  std::unordered_map<void*, std::string> name_of;
  for (const auto& p : model_->named_parameters()) {
    names.push_back("parameter " + p.key());
    tensors.push_back(p.value());
    name_of[p.value().unsafeGetTensorImpl()] = p.key();
  }
  // Stage 1: each rank holds the state of its own slices only; the weights are still compared.
  static const std::vector<torch::optim::OptimizerParamGroup> kNoGroups;
  const auto& groups = dp_->zero_stage() >= 1 ? kNoGroups : optimizer_->param_groups();
  for (const auto& group : groups)
    for (const auto& p : group.params()) {
      auto it = optimizer_->state().find(p.unsafeGetTensorImpl());
      if (it == optimizer_->state().end()) continue;
      const std::string& pname = name_of[p.unsafeGetTensorImpl()];
      if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        names.push_back("AdamW exp_avg of " + pname);
        tensors.push_back(a->exp_avg());
        names.push_back("AdamW exp_avg_sq of " + pname);
        tensors.push_back(a->exp_avg_sq());
        names.push_back("AdamW step of " + pname);
        tensors.push_back(torch::tensor({a->step()}, torch::kInt64));
      }
    }
  std::string digest;
  for (const auto& t : tensors) {
    torch::Tensor c = t.detach().contiguous().cpu();
    uLong crc = crc32_z(0L, Z_NULL, 0);
    crc = crc32_z(crc, static_cast<const Bytef*>(c.data_ptr()),
                  static_cast<size_t>(c.numel() * c.element_size()));
    digest += fmt::format("{:08x}", static_cast<uint32_t>(crc));
  }
  const std::vector<std::string> all = comm_->all_gather(digest);
  for (std::size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] == all[0]) continue;
    if (all[rank].size() != all[0].size())
      throw Error(fmt::format("replica check at step {}: rank {} holds {} parameter and optimizer "
                              "tensors, rank 0 holds {}; the replicas have diverged",
                              state_.step, rank, all[rank].size() / 8, all[0].size() / 8));
    std::size_t first = 0, differing = 0;
    for (std::size_t i = 0; i < names.size(); ++i)
      if (all[rank].compare(8 * i, 8, all[0], 8 * i, 8) != 0 && differing++ == 0) first = i;
    throw Error(fmt::format(
        "replica check at step {}: rank {} differs from rank 0 in {} (and {} more of {} tensors); "
        "the replicas must be identical — a rank computed differently (hardware fault, "
        "non-deterministic kernel, or a bug). Resume from the last checkpoint; "
        "dist.check_every_steps={} sets how often this is checked", state_.step, rank,
        names[first], differing - 1, names.size(), recipe_.dist.check_every_steps));
  }
  spdlog::debug("replica check at step {}: {} tensors identical on {} ranks", state_.step,
                names.size(), all.size());
}

std::vector<OptimizerPiece> Trainer::optimizer_pieces() const {
  std::vector<OptimizerPiece> pieces;
  if (dp_->zero_stage() >= 1) {
    for (const auto& seg : dp_->shard_segments())
      pieces.push_back({seg.name, seg.begin, seg.end, seg.param_numel, seg.param});
  } else {
    for (const auto& p : named_params_)
      pieces.push_back({p.name, 0, p.param.numel(), p.param.numel(), p.param});
  }
  return pieces;
}

}  // namespace mllm
