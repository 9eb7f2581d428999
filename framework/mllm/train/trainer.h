// The Trainer: builds every part of a run from the recipe through the registries (tokenizer,
// datasets, model, DataParallel, optimizer, lr schedule, sampler, callbacks) and runs the loop
//   lr for this step -> micro-steps (forward, backward; gradients all-reduced on the last) ->
//   finish sync -> clip -> optimizer step -> callbacks
// with exact resume from checkpoints and early, checkpointed stops (signals, time limits).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/core/recipe.h"
#include "mllm/core/stop_signal.h"  // install_stop_signal_handlers, stop_signal_received
#include "mllm/data/dataset.h"
#include "mllm/data/sampler.h"
#include "mllm/data/tokenizer.h"
#include "mllm/distributed/communicator.h"
#include "mllm/distributed/data_parallel.h"
#include "mllm/model/model.h"
#include "mllm/optim/lr_schedule.h"
#include "mllm/train/callback.h"
#include "mllm/train/checkpoint.h"
#include "mllm/train/run_lock.h"
#include "mllm/train/sync_debug.h"

namespace mllm {
class CheckedFile;
class TensorBoardWriter;
}

namespace mllm {

class Trainer {
 public:
  // Validates the recipe for comm's world size, locks the run folder (rank 0; RunFolderLock),
  // prepares the data if needed (rank 0 tokenizes while the other ranks wait), builds all parts,
  // and resumes per checkpoint.resume. Writes nothing before the recipe and world size are known
  // to be valid. Refuses (DataError) a val split shorter than one sequence when `eval` is among
  // the callbacks. Optimizer and schedule hyperparameters (optim.lr, weight_decay, betas,
  // grad_clip, schedule.*) may differ from the checkpoint's: each change is warned about and
  // recorded in metrics.jsonl; any other change that would alter the run is a CheckpointError.
  // Throws ConfigError / DataError / CheckpointError (bad input) or Error.
  Trainer(Recipe recipe, std::shared_ptr<Communicator> comm);
  ~Trainer();

  // Trains until train.max_steps, train.stop_at_step, train.time_limit_s or SIGTERM/SIGINT.
  // Every early stop saves a checkpoint first. Ends with a summary in the log (steps, tokens,
  // wall time, final train loss, best val loss and perplexity, last checkpoint). Returns why
  // it stopped. A non-finite loss or
  // gradient norm stops the run (mllm::Error naming the step) before the update reaches the
  // weights, or with train.on_nonfinite=skip skips that update on every rank (stopping after
  // train.max_nonfinite_skips in a row). Every dist.check_every_steps steps the replicas are
  // compared (check_replicas). Errors of a collective name the step.
  StopReason run();

  // Collective: mean val loss over the first eval.batches batches of micro_batch val sequences,
  // split across ranks (the same sequences at any world size; data/sampler.h). Throws DataError
  // if the val shard has no sequence, and mllm::Error when the val loss is not finite (the
  // weights diverged: the callbacks then never save this step, `latest` stays on the last
  // finite checkpoint). A finite result goes to every callback's on_eval_end before it returns.
  EvalMetrics evaluate();
  // Collective: hashes (CRC-32 of the bytes) every parameter and optimizer-state tensor on each
  // rank and compares them with rank 0's. Throws mllm::Error naming the first differing rank
  // and tensor when the replicas have drifted apart (they must be bitwise identical).
  void check_replicas();
  // Collective: saves a checkpoint of the current step (no-op if this step is already saved).
  // Returns the folder.
  std::string save_checkpoint();
  // Collective (every rank calls it: at dist.zero_stage 3 the ranks gather the weights for it):
  // rank 0 continues each sample.prompts entry and returns the texts (prompt + continuation);
  // the other ranks return an empty list.
  std::vector<std::string> generate_samples();
  // Appends one JSON object as a line to <out_dir>/metrics.jsonl, and with log.tensorboard its
  // numbers to TensorBoard (rank 0 only; others no-op). Throws mllm::Error "cannot write
  // <path>: <reason>" when the write fails (a full disk).
  void write_metrics_line(const std::string& json_line);
  // With log.tensorboard: `text` (markdown) under `tag` at the current step in TensorBoard
  // (rank 0 only; a no-op otherwise). Throws mllm::Error on a write failure.
  void write_text(const std::string& tag, const std::string& text);

  const Recipe& recipe() const { return recipe_; }
  Communicator& comm() { return *comm_; }
  // The model; at dist.zero_stage 1-3 first waits for the parameters' all-gather in flight. At
  // stage 3 the parameters hold no memory between steps: whatever runs or reads the model
  // outside the trainer's own step and eval (a plugin callback) holds a
  // DataParallel::FullParams scope on data_parallel() (collective: on every rank) while it does.
  LanguageModel& model();
  DataParallel& data_parallel() { return *dp_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int64_t step() const { return state_.step; }
  // Where this rank's model, batches and optimizer state live (train.device; train/device.h).
  const torch::Device& device() const { return device_; }
  const std::string& run_dir() const { return run_dir_; }
  std::string checkpoints_dir() const { return run_dir_ + "/checkpoints"; }
  // Peak FLOP/s of the whole job, the MFU denominator: each node's GEMM throughput on its
  // usable cores (or each GPU's), measured at start-up in train.precision's dtype (train/mfu.h).
  double peak_flops() const { return peak_flops_; }
  // Seconds since this Trainer was constructed (train.time_limit_s counts from there; leave
  // a margin for the final checkpoint when setting it under a scheduler's limit).
  double seconds_running() const;

 private:
  // build() runs these phases in this order.
  void build();
  void check_same_recipe();
  std::vector<std::string> lock_run_folder();
  std::string decide_resume();
  void start_logging(const std::vector<std::string>& interrupted);
  void build_data();
  void build_model();
  void build_optimizer();
  void build_schedule_and_sampler();
  void open_run_outputs(const std::string& resume_folder);
  void build_callbacks();
  void measure_peak();
  void resume_from(const std::string& folder);
  // Throws CheckpointError when the corpus files changed since `saved` (naming them), unless
  // checkpoint.allow_data_change; then warns.
  void check_resumed_data(const std::string& folder, const TrainState& saved);
  StepMetrics train_step();
  // The end-of-run summary line (rank 0's log; every rank logs its own copy).
  void log_summary(int64_t first_step, int64_t first_tokens) const;
  // train.sync_debug: the part of the step the next host synchronisations belong to.
  void sync_phase(const char* phase);
  // train.sync_debug: stops collecting, logs the sites, rank 0 writes <run>/sync_debug.json.
  void finish_sync_debug();

  Recipe recipe_;
  std::shared_ptr<Communicator> comm_;
  torch::Device device_{torch::kCPU};
  int threads_ = 1;  // intra-op threads of this rank (train.threads resolved)
  std::string run_dir_;
  std::string tokenizer_path_;
  std::shared_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TokenDataset> train_data_, val_data_;  // train_data_: data.corpus only
  std::unique_ptr<BatchSampler> sampler_;
  // data.sources: one train dataset per source, their offsets in the sampler's global ids, and
  // the sampler itself (also in sampler_) for the draws per source.
  std::vector<std::unique_ptr<TokenDataset>> source_data_;
  std::vector<int64_t> source_offsets_;
  MixtureSampler* mixture_ = nullptr;
  // Validation: val_data_ (all val shards), or for a mixture each source's val set read in
  // round-robin order (interleaved_ids), so that a few val batches cover every source.
  std::vector<std::unique_ptr<TokenDataset>> val_sources_;
  std::vector<int64_t> val_source_sizes_;
  int64_t val_size_ = 0;  // sequences of the val set
  Batch val_get(const std::vector<int64_t>& positions) const;
  std::shared_ptr<LanguageModel> model_;
  std::unique_ptr<DataParallel> dp_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<NamedParam> named_params_;  // the model's parameters, for the optimizer groups
  // The pieces whose AdamW state this rank's optimizer holds (stage 1: its shard segments).
  std::vector<OptimizerPiece> optimizer_pieces() const;
  std::shared_ptr<LrSchedule> schedule_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::unique_ptr<RunFolderLock> lock_;          // rank 0: held for the Trainer's lifetime
  std::unique_ptr<CheckedFile> metrics_;         // rank 0: metrics.jsonl, appended to
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0 with log.tensorboard
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> resume_changes_;
  // The lr at the resumed step under the checkpoint's schedule and this recipe's, when they
  // differ (train.max_steps or the schedule changed): warned about and put in the resume event.
  struct ResumeLr {
    int64_t step = 0;
    double checkpoint = 0, recipe = 0;
    int64_t checkpoint_max_steps = 0;
  };
  std::optional<ResumeLr> resume_lr_;
  int64_t consecutive_skips_ = 0;
  TrainState state_;
  int64_t last_saved_step_ = -1;
  int64_t flops_per_token_ = 0;
  double peak_flops_ = 0;
  double elapsed_at_start_s_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::optional<StopReason> stop_reason_;  // set by train_step when any rank votes to stop
  // For the end-of-run summary: the last applied step's train loss, the best evaluation.
  double last_train_loss_ = std::numeric_limits<double>::quiet_NaN();
  std::optional<EvalMetrics> best_eval_;
  std::unique_ptr<SyncDebug> sync_debug_;  // train.sync_debug, from the invocation's second step
  int64_t sync_debug_steps_ = 0;
};

// Every registry name the recipe uses (data.tokenizer.type, model.type, optim.type,
// schedule.type, callbacks) exists, with the built-ins registered and the recipe's plugins
// loaded. Throws ConfigError naming the key, the source — `<command line> KEY=VALUE` when one of
// `overrides` set it, else the recipe file — and the known names with a did-you-mean. mllm-train
// calls it as soon as the recipe is read (so --print-recipe refuses a typo too); the Trainer
// again, before anything is written.
void check_component_names(const Recipe& recipe, const std::vector<std::string>& overrides = {});

// Threads per rank for train.threads: an explicit value (> 0) as given, with a warning when the
// ranks of this node then run more threads than usable_cpus() (train/device.h); 0 = auto:
// OMP_NUM_THREADS when set to a positive integer (launch/mpirun.sh sets it), else
// usable_cpus() / ranks on this node, at least 1.
int resolve_threads(int64_t threads, int local_size);
// The same rule with its inputs given (no warning): `usable` CPUs, `omp_num_threads` the
// environment value or nullptr.
int resolve_threads(int64_t threads, int local_size, int usable, const char* omp_num_threads);

}  // namespace mllm
