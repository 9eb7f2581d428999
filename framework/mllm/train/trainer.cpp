// The training loop: build from the recipe, resume, micro-steps with gradient accumulation,
// synced clipping, AdamW, lr schedule, callbacks, checkpointed early stops.
#include "mllm/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <zlib.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/blas.h"
#include "mllm/core/error.h"
#include "mllm/core/fault.h"
#include "mllm/core/logging.h"
#include "mllm/core/plugin.h"
#include "mllm/core/trace.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/prepare.h"
#include "mllm/distributed/prepare_group.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/model/generate.h"
#include "mllm/model/loss.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/builtins.h"
#include "mllm/train/device.h"
#include "mllm/train/mfu.h"
#include "mllm/train/profiler.h"
#include "mllm/train/tensorboard.h"

namespace fs = std::filesystem;

namespace mllm {
namespace {

// The value of `key` in at::show_config()'s "key=value, " settings or "  - key: value" lines;
// "?" when absent.
std::string torch_config_value(const std::string& config, const std::string& key) {
  for (const std::string& sep : {std::string("="), std::string(": ")}) {
    const auto at = config.find(key + sep);
    if (at == std::string::npos) continue;
    const auto begin = at + key.size() + sep.size();
    const auto end = config.find_first_of(",\n", begin);
    return config.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  return "?";
}

// One line on the LibTorch in use and the device: version, CUDA build, BLAS and CPU kernels,
// visible GPUs, where this rank trains.
std::string describe_libtorch(const torch::Device& device) {
  const std::string config = at::show_config();
  const std::string cuda = torch_config_value(config, "CUDA_VERSION");
  const int gpus = visible_gpus();
  std::string where;
  if (device.is_cuda())
    where = fmt::format("{} GPU(s) visible: training on {}", gpus, device.str());
  else if (gpus == 0)
    where = "no GPU visible: training on the CPU";
  else
    where = fmt::format("{} GPU(s) visible, training on the CPU (train.device=cpu)", gpus);
  return fmt::format("LibTorch {} ({}), BLAS {}, CPU kernels {}; {}", TORCH_VERSION,
                     cuda == "?" ? "CPU only" : "CUDA " + cuda,
                     torch_config_value(config, "BLAS_INFO"),
                     torch_config_value(config, "CPU capability usage"), where);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// bf16 autocast on `device`'s type for the scope; restores the previous autocast state on exit
// and clears autocast's cache of bf16 weight casts, unless `keep_cache` (the training step keeps
// it for all its micro-batches and clears it with AutocastCacheClearedAtExit).
class Autocast {
 public:
  Autocast(bool enabled, const torch::Device& device, bool keep_cache = false)
      : enabled_(enabled), keep_cache_(keep_cache), type_(device.type()) {
    if (!enabled_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~Autocast() {
    if (!enabled_) return;
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
    if (!keep_cache_) at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_;
  bool keep_cache_;
  at::DeviceType type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// Clears autocast's cache when the scope ends, however it ends: the bf16 casts of the weights
// must not outlive the optimizer step that changes the weights.
struct AutocastCacheClearedAtExit {
  AutocastCacheClearedAtExit() = default;
  ~AutocastCacheClearedAtExit() { at::autocast::clear_cache(); }
  AutocastCacheClearedAtExit(const AutocastCacheClearedAtExit&) = delete;
  AutocastCacheClearedAtExit& operator=(const AutocastCacheClearedAtExit&) = delete;
};

// The batch on `device`: pinned host memory and a non-blocking copy for a GPU.
Batch to_device(Batch b, const torch::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.pin_memory().to(device, /*non_blocking=*/true);
  b.targets = b.targets.pin_memory().to(device, /*non_blocking=*/true);
  return b;
}

bool changes_training_on_resume(const std::string& key);

bool matches_any(const std::string& key, std::initializer_list<const char*> patterns) {
  for (const char* a : patterns) {
    std::string p(a);
    if (p.back() == '.' ? key.rfind(p, 0) == 0 : key == p) return true;
  }
  return false;
}

// Recipe keys that may change between a checkpoint and the run resuming it. Everything else
// (model shape, tokenizer, data, batch sizes, optimizer type, seed) would silently change the run.
bool may_change_on_resume(const std::string& key) {
  // A callback's own options section (options.h): callbacks may change, so may their options.
  if (find_options("callback", key.substr(0, key.find('.')))) return true;
  return matches_any(key, {"run.name", "run.out_dir", "train.max_steps", "train.stop_at_step",
                           "train.time_limit_s", "train.threads", "train.device", "train.tf32",
                           "train.sync_debug", "train.on_nonfinite", "train.max_nonfinite_skips",
                           "model.attn_impl", "model.activation_checkpointing",
                           "model.checkpoint_every", "data.prepare_memory_mb",
                           "data.prepare_segment_bytes", "callbacks", "plugins", "checkpoint.", "eval.",
                           "sample.", "log.", "profile.", "dist."}) ||
         changes_training_on_resume(key);
}

// Of those, the hyperparameters that change the training from the resumed step on — the
// standard "rewind to the last good checkpoint and lower the lr" — warned about and recorded.
bool changes_training_on_resume(const std::string& key) {
  // train.max_steps too: the lr schedule spans it (a longer run re-bends the decay).
  return matches_any(key, {"optim.lr", "optim.weight_decay", "optim.betas", "optim.grad_clip",
                           "schedule.", "train.max_steps"});
}

// Rewrites metrics.jsonl without the lines whose "step" is greater than `step` (and without a
// line torn by a crash). The new file is written beside the old one, read back and compared
// before it replaces it, so a full disk can never cost the lines that were already there.
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

}  // namespace

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

namespace {
// ZeRO stage 3: the model's per-block hook points drive DataParallel's gathers and frees.
class ZeroBlockHooks : public BlockHooks {
 public:
  explicit ZeroBlockHooks(DataParallel* dp) : dp_(dp) {}
  void before_forward(int64_t layer) override { dp_->pre_forward(layer); }
  void after_forward(int64_t layer) override { dp_->post_forward(layer); }
  void before_backward(int64_t layer) override { dp_->pre_backward(layer); }

 private:
  DataParallel* dp_;
};
}  // namespace

Trainer::~Trainer() {
  // The hooks point at dp_, which goes before a model that someone else may still hold.
  if (model_) model_->set_block_hooks(nullptr);
}

void Trainer::build() {
  check_same_recipe();
  const std::vector<std::string> interrupted = lock_run_folder();
  const std::string resume_folder = decide_resume();
  start_logging(interrupted);
  build_data();
  build_model();
  build_optimizer();
  build_schedule_and_sampler();
  // Dropout masks differ per rank (as with independent DDP processes) but are reproducible.
  torch::manual_seed(static_cast<uint64_t>(recipe_.run.seed) + 7919ull * (comm_->rank() + 1));
  state_.world_size = comm_->world_size();
  if (!resume_folder.empty()) resume_from(resume_folder);
  open_run_outputs(resume_folder);
  build_callbacks();
  measure_peak();
}

// Every rank must run the same recipe: a difference (a stale file on one node, an override
// given to one rank) would silently desynchronise the replicas.
void Trainer::check_same_recipe() {
  auto hashes = comm_->all_gather(fmt::format("{:016x}", recipe_hash(recipe_)));
  for (std::size_t i = 1; i < hashes.size(); ++i)
    if (hashes[i] != hashes[0])
      throw ConfigError(fmt::format("rank {} resolved a different recipe than rank 0 (hash {} vs "
                                    "{}); give every rank the same recipe and overrides",
                                    i, hashes[i], hashes[0]));
}

// One writer per run folder: rank 0 locks it before anything in it is read or written, so a
// second run on the same folder cannot resume from, and overwrite, this one's files. Returns the
// interrupted saves rank 0 removed (logged once logging exists).
std::vector<std::string> Trainer::lock_run_folder() {
  std::string lock_error;
  if (comm_->rank() == 0) {
    try {
      lock_ = std::make_unique<RunFolderLock>(run_dir_);
    } catch (const ConfigError& e) {
      lock_error = e.what();
    }
  }
  lock_error = comm_->all_gather(lock_error)[0];
  if (!lock_error.empty()) throw ConfigError(lock_error);
  if (comm_->rank() == 0) return remove_interrupted_saves(checkpoints_dir());
  return {};
}

// The checkpoint to resume from ("" for a fresh start): rank 0 reads the folder, everyone
// follows its answer. Refuses a recipe that changed in ways that break the run; records the
// hyperparameter changes that may be made (resume_changes_).
std::string Trainer::decide_resume() {
  const Recipe& r = recipe_;
  std::string resume_folder;
  if (comm_->rank() == 0) {
    resume_folder = find_resume_checkpoint(r.checkpoint.resume, checkpoints_dir()).value_or("");
    // A fresh start over another run's checkpoints would mix two runs in one folder (and
    // keep_last could delete the new saves in favour of the old run's higher steps).
    if (r.checkpoint.resume == "none" && fs::exists(checkpoints_dir() + "/latest"))
      throw ConfigError(fmt::format(
          "{}: checkpoint.resume=none but {} already holds checkpoints of a run; choose another "
          "run.out_dir, delete that folder, or resume (checkpoint.resume=auto)",
          r.source, checkpoints_dir()));
  }
  resume_folder = comm_->all_gather(resume_folder)[0];
  if (resume_folder.empty()) return resume_folder;
  // Against the plugins this run loaded: the saved plugin paths may have moved since.
  Recipe saved = load_recipe_string(read_checkpoint_recipe(resume_folder),
                                    resume_folder + "/recipe.yaml", {}, ".",
                                    RecipePlugins::kAlreadyLoaded);
  std::string breaking;
  for (const auto& d : recipe_diff(saved, r)) {
    if (!may_change_on_resume(d.key))
      breaking += fmt::format("\n  {}: checkpoint {} -> recipe {}", d.key, d.a, d.b);
    else if (changes_training_on_resume(d.key))
      resume_changes_.push_back({d.key, {d.a, d.b}});
  }
  if (!breaking.empty())
    throw CheckpointError("cannot resume from " + resume_folder +
                          ": the recipe changed in ways that break the run:" + breaking +
                          "\nrestore these values, or start a new run (checkpoint.resume=none "
                          "or another run.out_dir)");
  // The lr at the resumed step under the checkpoint's schedule and under this recipe's: they
  // differ when train.max_steps (or the schedule) changed, and the step's lr jumps there.
  const int64_t step = read_train_state(resume_folder).step;
  const double before = lr_schedule_registry()
                            .create(saved.schedule.type, saved.schedule, saved.optim.lr,
                                    saved.train.max_steps)
                            ->lr(step);
  const double now =
      lr_schedule_registry().create(r.schedule.type, r.schedule, r.optim.lr, r.train.max_steps)->lr(step);
  if (before != now) resume_lr_ = ResumeLr{step, before, now, saved.train.max_steps};
  return resume_folder;
}

// Run folder, logs, threads, device and the start-up lines: only now that the recipe is known
// to be valid.
void Trainer::start_logging(const std::vector<std::string>& interrupted) {
  const Recipe& r = recipe_;
  const int rank = comm_->rank(), world = comm_->world_size();
  fs::create_directories(run_dir_);
  init_logging(rank, world, resolve_log_level(r.log.level), run_dir_ + "/logs");
  // mllm-train's main installed them first thing; a program that builds a Trainer gets them here.
  install_stop_signal_handlers();
  threads_ = resolve_threads(r.train.threads, comm_->local_size());
  torch::set_num_threads(threads_);
  device_ = rank_device(resolve_device_type(r.train.device, r.source), comm_->local_rank());
  // The backend as tools read it (launch/gpu-check.sh fails a run that fell back to another):
  // "nccl", "mpi", "mpi staged" (CUDA tensors through pinned host memory), "single".
  const std::string backend = comm_->backend() == "mpi" && device_.is_cuda()
                                  ? "mpi staged backend: CUDA tensors through pinned host memory"
                                  : comm_->backend() + " backend";
  spdlog::info("run {}: world size {} ({}), {} threads per rank, device {}, recipe {}", r.run.name,
               world, backend, threads_, device_.str(), r.source);
  for (const auto& name : interrupted)
    spdlog::warn("removed {}/{}, left by an interrupted checkpoint save", checkpoints_dir(), name);
  // The resume's changes read the same on every rank: rank 0 says them once.
  if (comm_->rank() == 0)
    for (const auto& [key, values] : resume_changes_)
      spdlog::warn("resuming with {} changed: checkpoint {} -> recipe {} (applies from the "
                   "resumed step on)", key, values.first, values.second);
  if (resume_lr_ && comm_->rank() == 0)
    spdlog::warn("the lr at the resumed step {} is {:.4e}, where the checkpoint's schedule "
                 "(train.max_steps={}) gave {:.4e}: the schedule spans train.max_steps={}, so "
                 "from here on the lr follows that run's curve (a longer run decays later, a "
                 "shorter one sooner; docs/checkpoints.md); to go on at the checkpoint's lr "
                 "instead, resume with schedule.type=constant schedule.warmup_steps=0 "
                 "optim.lr={:.6g}",
                 resume_lr_->step, resume_lr_->recipe, resume_lr_->checkpoint_max_steps,
                 resume_lr_->checkpoint, r.train.max_steps, resume_lr_->checkpoint);
  if (device_.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(r.train.tf32);
    at::globalContext().setAllowTF32CuDNN(r.train.tf32);
  }
  spdlog::info("{}", describe_libtorch(device_));
  // The CPU's BLAS (also on a GPU run: it serves the CPU-side math); a warning when it runs
  // slower than the CPU allows and nothing corrected it (core/blas.h).
  if (blas_startup_note().warn) spdlog::warn("{}", describe_blas());
  else spdlog::info("{}", describe_blas());
}

// Data: the prepared cache (every rank prepares a share of the corpus when it is missing), the
// train and val datasets, and the tokenizer.
void Trainer::build_data() {
  const Recipe& r = recipe_;
  const int rank = comm_->rank(), world = comm_->world_size();
  // Every rank prepares a share of the corpus (segments) when the cache of this data
  // fingerprint is missing, with this rank's threads; the output does not depend on how many.
  PreparedData paths;
  {
    const auto group = make_prepare_group();
    bool prepared = false;
    paths = ensure_prepared(r.data, threads_, rank == 0 && isatty(STDERR_FILENO), *group,
                            /*force=*/false, &prepared);
    if (prepared) spdlog::info("prepared data into {} (tokenizer + shards)", paths.dir);
  }
  // After preparation, which returns its large buffers to the system as it goes (prepare.h).
  if (const std::string malloc_note = keep_freed_cpu_memory(); !malloc_note.empty())
    spdlog::info("{}", malloc_note);
  tokenizer_path_ = paths.tokenizer_path;
  tokenizer_ = load_tokenizer(paths.tokenizer_path);
  int64_t train_sequences = 0;
  if (r.data.sources.empty()) {
    train_data_ = std::make_unique<TokenDataset>(paths.train_shards, r.data.mode, r.data.seq_len);
    train_data_->check_tokenizer(*tokenizer_);
    train_sequences = train_data_->size();
  } else {
    MLLM_CHECK(paths.sources.size() == r.data.sources.size(), "prepared sources != data.sources");
    for (size_t k = 0; k < paths.sources.size(); ++k) {
      source_data_.push_back(std::make_unique<TokenDataset>(paths.sources[k].train_shards,
                                                            r.data.mode, r.data.seq_len));
      source_data_.back()->check_tokenizer(*tokenizer_);
      source_offsets_.push_back(train_sequences);
      train_sequences += source_data_.back()->size();
      spdlog::info("data source {} '{}': {} train sequences, weight {} ({:.1f}% of the draws)", k,
                   r.data.sources[k].name, source_data_.back()->size(), r.data.sources[k].weight,
                   100.0 * r.data.sources[k].weight / [&] {
                     double w = 0;
                     for (const auto& s : r.data.sources) w += s.weight;
                     return w;
                   }());
    }
  }
  val_data_ = std::make_unique<TokenDataset>(paths.val_shards, r.data.mode, r.data.seq_len);
  val_data_->check_tokenizer(*tokenizer_);
  val_size_ = val_data_->size();
  if (!r.data.sources.empty()) {
    val_size_ = 0;
    for (const auto& source : paths.sources) {
      val_sources_.push_back(
          std::make_unique<TokenDataset>(source.val_shards, r.data.mode, r.data.seq_len));
      val_source_sizes_.push_back(val_sources_.back()->size());
      val_size_ += val_sources_.back()->size();
    }
  }
  state_.tokenizer_fingerprint = tokenizer_->fingerprint();
  spdlog::info("data: vocab {}, {} train sequences, {} val sequences of {} tokens ({} mode)",
               tokenizer_->vocab_size(), train_sequences, val_size_, r.data.seq_len,
               r.data.mode);
  // Refused now, not at the first evaluation hundreds of steps (and perhaps no checkpoint) later.
  if (std::find(r.callbacks.begin(), r.callbacks.end(), "eval") != r.callbacks.end()) {
    if (val_size_ == 0)
      throw DataError(fmt::format(
          "{}: the validation split {} holds {} tokens, fewer than one sequence needs ({}); "
          "raise data.val_fraction (now {}), lower data.seq_len (now {}), or remove `eval` from "
          "callbacks", r.source, val_data_->path(), val_data_->token_count(),
          r.data.mode == "packed" ? fmt::format("data.seq_len + 1 = {} tokens in packed mode",
                                                r.data.seq_len + 1)
                                  : std::string("one document in document mode"),
          r.data.val_fraction, r.data.seq_len));
    const int64_t batches = std::min(r.eval.batches,
                                     val_batch_count(val_size_, r.train.micro_batch));
    spdlog::info("eval: {} val batches of up to {} sequences ({} of {} val sequences), split "
                 "across {} rank(s)", batches, r.train.micro_batch,
                 std::min(val_size_, batches * r.train.micro_batch), val_size_,
                 world);
  }
}

// Model: identical initialisation on every rank (same seed), then broadcast + verify anyway;
// wrapped in DataParallel (buckets, ZeRO stage, stage 3's block hooks).
void Trainer::build_model() {
  const Recipe& r = recipe_;
  torch::manual_seed(static_cast<uint64_t>(r.run.seed));
  model_ = model_registry().create(r.model.type, r.model, tokenizer_->vocab_size(), r.max_seq_len());
  model_->to(device_);  // initialised on the CPU first: the same weights on every device
  model_->set_activation_checkpointing(
      ActivationCheckpointing(r.model.activation_checkpointing, r.model.checkpoint_every));
  flops_per_token_ = model_->flops_per_token(r.data.seq_len);
  std::function<int64_t(const std::string&)> block_of;
  if (r.dist.zero_stage == 3) {
    if (!model_->supports_block_hooks())
      throw ConfigError(fmt::format("{}: dist.zero_stage=3 gathers each block's parameters from "
                                    "hooks around the blocks, and model.type={} runs its blocks "
                                    "without LanguageModel::run_block; use dist.zero_stage=2",
                                    r.source, r.model.type));
    if (r.optim.type != "adamw")  // checked again below for stages 1-2; before any gather here
      throw ConfigError(fmt::format("{}: dist.zero_stage=3 shards the state of the built-in adamw "
                                    "optimizer only; optim.type is '{}'", r.source, r.optim.type));
    block_of = [model = model_.get()](const std::string& name) { return model->block_of(name); };
  }
  dp_ = std::make_unique<DataParallel>(model_, comm_,
                                       static_cast<int64_t>(r.dist.bucket_mb * 1024 * 1024),
                                       static_cast<int>(r.dist.zero_stage), block_of);
  if (r.dist.zero_stage == 3) model_->set_block_hooks(std::make_shared<ZeroBlockHooks>(dp_.get()));
  dp_->broadcast_and_verify();
  spdlog::info("model {}: {} parameters, {} FLOPs per token (fwd+bwd)", r.model.type,
               model_->num_params(), flops_per_token_);
  if (r.model.activation_checkpointing != "none")
    spdlog::info("activation checkpointing ({}): {} of {} blocks keep only their input and "
                 "recompute their forward in backward (MFU counts model FLOPs: the recomputation "
                 "is not in it)", r.model.activation_checkpointing,
                 model_->activation_checkpointing().count(r.model.n_layers), r.model.n_layers);
}

// The optimizer over the parameters (stage 0) or this rank's shard segments (stages 1-3), and
// the per-rank memory line.
void Trainer::build_optimizer() {
  const Recipe& r = recipe_;
  for (const auto& p : model_->named_parameters())
    named_params_.push_back({p.key(), p.value(), model_->is_embedding(p.key())});
  if (r.dist.zero_stage >= 1) {
    // AdamW over this rank's shard segments, each in its parameter's weight-decay group.
    if (r.optim.type != "adamw")
      throw ConfigError(fmt::format("{}: dist.zero_stage={} shards the state of the built-in "
                                    "adamw optimizer only; optim.type is '{}' (use "
                                    "dist.zero_stage=0)",
                                    r.source, r.dist.zero_stage, r.optim.type));
    std::unordered_map<std::string, bool> decay_of;
    for (const auto& p : named_params_) decay_of[p.name] = decays(r.optim, p);
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& seg : dp_->shard_segments())
      (decay_of.at(seg.name) ? decay : no_decay).push_back(seg.param);
    optimizer_ = make_adamw(r.optim, std::move(decay), std::move(no_decay));
  } else {
    optimizer_ = optimizer_registry().create(r.optim.type, r.optim, named_params_);
  }
  {
    // Per-rank memory of the training state (AdamW: two moments per element it updates).
    const auto f = dp_->footprint();
    const int64_t elem = static_cast<int64_t>(named_params_.empty() ? 4 : named_params_.front().param.element_size());
    const int64_t opt_bytes = 2 * f.optimizer_elements * elem;
    auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20)); };
    spdlog::info("memory per rank (dist.zero_stage={}): parameters {}, gradients {}, optimizer state "
                 "{} (AdamW moments of {} of {} elements), {} in all{}{}", r.dist.zero_stage,
                 mib(f.param_bytes), mib(f.grad_bytes), mib(opt_bytes), f.optimizer_elements,
                 model_->num_params(), mib(f.param_bytes + f.grad_bytes + opt_bytes),
                 f.transient_grad_bytes > 0
                     ? fmt::format("; during backward up to {} more for the buckets in flight",
                                   mib(f.transient_grad_bytes))
                     : std::string(),
                 f.transient_param_bytes > 0
                     ? fmt::format("; during a step up to {} of gathered parameters (embeddings "
                                   "and head, and two blocks at once: the one computing and the "
                                   "one prefetched)", mib(f.transient_param_bytes))
                     : std::string());
  }
}

// The lr schedule and the batch sampler (one corpus, or a mixture of data.sources).
void Trainer::build_schedule_and_sampler() {
  const Recipe& r = recipe_;
  const int rank = comm_->rank(), world = comm_->world_size();
  schedule_ = lr_schedule_registry().create(r.schedule.type, r.schedule, r.optim.lr,
                                            r.train.max_steps);
  // Warnings about the recipe read the same on every rank: rank 0 says them once.
  if (rank == 0 && r.schedule.warmup_steps >= r.train.max_steps && r.schedule.warmup_steps > 0)
    spdlog::warn("schedule.warmup_steps={} >= train.max_steps={}: the lr ramps for the whole run "
                 "and reaches {:.3g} (of optim.lr={:.3g}) at the last step", r.schedule.warmup_steps,
                 r.train.max_steps, schedule_->lr(r.train.max_steps - 1), r.optim.lr);
  if (r.data.sources.empty()) {
    sampler_ = std::make_unique<DistributedSampler>(train_data_->size(), r.train.global_batch,
                                                    r.train.micro_batch, rank, world,
                                                    static_cast<uint64_t>(r.run.seed));
  } else {
    std::vector<int64_t> sizes;
    std::vector<double> weights;
    for (size_t k = 0; k < source_data_.size(); ++k) {
      if (source_data_[k]->size() == 0)
        throw ConfigError(fmt::format(
            "{}: data.sources[{}] ('{}') holds no training sequence ({} tokens, fewer than "
            "data.seq_len + 1 = {}); give it more text, lower data.seq_len or drop the source",
            r.source, k, r.data.sources[k].name, source_data_[k]->token_count(), r.data.seq_len + 1));
      sizes.push_back(source_data_[k]->size());
      weights.push_back(r.data.sources[k].weight);
    }
    auto mixture = std::make_unique<MixtureSampler>(sizes, weights, r.train.global_batch,
                                                    r.train.micro_batch, rank, world,
                                                    static_cast<uint64_t>(r.run.seed));
    mixture_ = mixture.get();
    sampler_ = std::move(mixture);
  }
}

// Rank 0's files of the run: metrics.jsonl (lines after the resumed step dropped), the resolved
// recipe, TensorBoard's events (log.tensorboard), the resume event.
void Trainer::open_run_outputs(const std::string& resume_folder) {
  const Recipe& r = recipe_;
  if (comm_->rank() != 0) return;
  // Lines logged after the checkpoint we resume from (a crash between saves) are replayed by
  // this run; drop them so every step appears once.
  drop_metrics_after(run_dir_ + "/metrics.jsonl", state_.step);
  const std::string recipe_yaml = to_yaml(r);
  write_file_atomic(run_dir_ + "/recipe.resolved.yaml", recipe_yaml);
  metrics_ = std::make_unique<CheckedFile>(run_dir_ + "/metrics.jsonl", /*append=*/true);
  if (r.log.tensorboard) {
    // The same for TensorBoard: what earlier files hold after this step is hidden from it.
    tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir_ + "/tensorboard", state_.step + 1);
    tensorboard_->add_text("recipe", "```yaml\n" + recipe_yaml + "```", state_.step);
    spdlog::info("TensorBoard: {} (tensorboard --logdir {}/tensorboard)", tensorboard_->path(),
                 run_dir_);
  }
  if (!resume_changes_.empty()) {
    nlohmann::json changed = nlohmann::json::object();
    for (const auto& [key, values] : resume_changes_)
      changed[key] = {{"checkpoint", values.first}, {"recipe", values.second}};
    nlohmann::json event = {{"step", state_.step}, {"event", "resume"}, {"from", resume_folder},
                            {"changed", changed}};
    if (resume_lr_) event["lr"] = {{"checkpoint", resume_lr_->checkpoint}, {"recipe", resume_lr_->recipe}};
    write_metrics_line(event.dump());
  }
}

// The recipe's callbacks, then profile.steps's: eval before the checkpoint (a diverged val loss
// must not be saved), samples after it.
void Trainer::build_callbacks() {
  const Recipe& r = recipe_;
  for (const auto& name : r.callbacks) callbacks_.push_back(callback_registry().create(name, r));
  if (!r.profile.steps.empty()) callbacks_.push_back(make_profiler_callback(r));
  std::stable_sort(callbacks_.begin(), callbacks_.end(), [](const auto& a, const auto& b) {
    return static_cast<int>(a->phase()) < static_cast<int>(b->phase());
  });
}

// The MFU denominator (train/mfu.h): the job's hardware, measured once per node.
void Trainer::measure_peak() {
  const bool bf16 = recipe_.train.precision == "bf16";
  const JobPeak peak = measure_job_peak_flops(*comm_, bf16, device_);
  peak_flops_ = peak.flops;
  std::string how = peak.how;
  bool bf16_on_sgemm = false;
  if (bf16) {
    // Before the first product, from the job-wide rates every rank shares; the ranks must agree
    // (MLLM_BF16_GEMM and the AMX test are per rank), or the replicas would round differently.
    // Every bf16 rank takes part in the gathers; a rank on a GPU sends -1 and is not compared.
    const bool cpu = device_.is_cpu();
    const int64_t path =
        cpu ? static_cast<int64_t>(choose_bf16_gemm(peak.cpu_bf16_flops, peak.cpu_fp32_flops,
                                                    peak.cpu_mkl_bf16_flops))
            : -1;
    const auto paths = comm_->all_gather(path);
    const auto described = comm_->all_gather(cpu ? describe_bf16_gemm() : std::string());
    std::size_t first = 0;
    while (first < paths.size() && paths[first] < 0) ++first;
    for (std::size_t i = first + 1; i < paths.size(); ++i)
      if (paths[i] >= 0 && paths[i] != paths[first])
        throw ConfigError(fmt::format(
            "rank {} runs bf16's products with {}, rank {} with {}: set MLLM_BF16_GEMM alike on "
            "every rank (docs/precision.md)", i, described[i], first, described[first]));
    bf16_on_sgemm = path == static_cast<int64_t>(Bf16GemmPath::kSgemm);
    // The products then run on the fp32 units: their rate is the peak.
    if (bf16_on_sgemm && peak.cpu_fp32_flops > 0) {
      peak_flops_ = peak.cpu_fp32_flops;
      std::string measured = peak.how;
      const auto at = measured.find("measured bf16 GEMM");
      if (at != std::string::npos) measured.replace(at, 18, "measured fp32 GEMM");
      how = measured + "; it runs bf16's products here (float32 sgemm on widened bf16 operands)";
    }
  }
  spdlog::info("MFU peak {} = {}", peak_flops_ >= 1e12 ? fmt::format("{:.2f} TFLOP/s", peak_flops_ / 1e12)
                                                    : fmt::format("{:.1f} GFLOP/s", peak_flops_ / 1e9),
               how);
  if (bf16 && device_.is_cpu())
    spdlog::info("bf16 products: {} (docs/precision.md)", describe_bf16_gemm());
  if (!device_.is_cpu() || peak.cpu_fp32_flops <= 0) return;
  if (peak.cpu_bf16_flops <= 0) {
    spdlog::info("CPU GEMM: fp32 {:.1f} GFLOP/s; no bf16 units ({}: no avx512_bf16 or amx_bf16), "
                 "so train.precision=bf16 is expected to train slower than fp32 here",
                 peak.cpu_fp32_flops / 1e9, detect_cpu_isa().describe());
    return;
  }
  // bf16 against fp32 from the two measured GEMM rates: the matmuls are most of a step's work,
  // so their ratio says which precision is expected to train faster on this CPU.
  const double ratio = peak.cpu_bf16_flops / peak.cpu_fp32_flops;
  const std::string cpu_and_mkl =
      (peak.cpu_mkl_bf16_flops > 0
           ? fmt::format("oneMKL's bf16 GEMM {:.1f} GFLOP/s; ", peak.cpu_mkl_bf16_flops / 1e9)
           : std::string()) +
      detect_cpu_isa().describe();
  if (bf16_on_sgemm) {
    // The products run at the fp32 rate; bf16 adds roundings and conversions and saves memory.
    spdlog::info("CPU GEMM: bf16 {:.1f} GFLOP/s, fp32 {:.1f} GFLOP/s (bf16 / fp32 = {:.2f}; {}): "
                 "bf16's products run as float32 GEMMs here, so train.precision=bf16 is "
                 "expected to train somewhat slower than fp32 (not faster), with its activations "
                 "in bf16", peak.cpu_bf16_flops / 1e9, peak.cpu_fp32_flops / 1e9, ratio,
                 cpu_and_mkl);
    return;
  }
  const char* verdict = ratio > 1.1 ? "faster than" : ratio < 0.9 ? "slower than" : "about as fast as";
  spdlog::info("CPU GEMM: bf16 {:.1f} GFLOP/s, fp32 {:.1f} GFLOP/s (bf16 / fp32 = {:.2f}; {}): "
               "train.precision=bf16 is expected to train {} fp32 here", peak.cpu_bf16_flops / 1e9,
               peak.cpu_fp32_flops / 1e9, ratio, cpu_and_mkl, verdict);
  if (bf16 && ratio < 0.9 && comm_->rank() == 0)
    spdlog::warn("train.precision=bf16 on a CPU whose bf16 GEMM is slower than its fp32 GEMM "
                 "(bf16 / fp32 = {:.2f}): bf16 will train slower than fp32 here; use "
                 "train.precision=fp32", ratio);
}

void Trainer::resume_from(const std::string& folder) {
  TrainState saved = read_train_state(folder);
  if (saved.tokenizer_fingerprint != state_.tokenizer_fingerprint)
    throw CheckpointError(fmt::format(
        "cannot resume from {}: its tokenizer (fingerprint {:016x}) differs from the one in {} "
        "({:016x}); the data was re-prepared differently", folder, saved.tokenizer_fingerprint,
        recipe_.data.cache_dir, state_.tokenizer_fingerprint));
  {
    DataParallel::FullParams full(*dp_);  // stage 3: the loaded weights become the shards
    load_model_weights(folder, *model_);
  }
  if (recipe_.dist.zero_stage >= 1 || has_sharded_optimizer_state(folder))
    load_optimizer_state_resharded(folder, *optimizer_, optimizer_pieces(), named_params_,
                                   recipe_.optim);
  else
    load_optimizer_state(folder, *optimizer_);
  // The recipe's betas / eps / weight decay, not the checkpoint's (they may change on resume).
  if (!apply_optimizer_hyperparams(*optimizer_, recipe_.optim))
    for (const auto& [key, values] : resume_changes_)
      if (key == "optim.weight_decay" || key == "optim.betas")
        throw CheckpointError(fmt::format(
            "cannot resume from {} with {} changed ({} -> {}): optimizer {} does not take new "
            "hyperparameters on resume; restore the value", folder, key, values.first,
            values.second, recipe_.optim.type));
  sampler_->load_state(saved.sampler);
  bool rng = load_rng_state(folder, comm_->rank(), device_);
  if (saved.world_size != comm_->world_size()) {
    if (comm_->rank() == 0)
      spdlog::warn("resuming a {}-rank checkpoint with {} ranks: same global batches, but dropout "
                   "RNG streams are re-seeded", saved.world_size, comm_->world_size());
  } else if (!rng) {
    throw CheckpointError("checkpoint " + folder + " has no RNG state for rank " +
                          std::to_string(comm_->rank()));
  }
  state_.step = saved.step;
  state_.tokens = saved.tokens;
  state_.sampler = saved.sampler;
  state_.elapsed_s = saved.elapsed_s;
  state_.lr = saved.lr;
  state_.nonfinite_skips = saved.nonfinite_skips;
  elapsed_at_start_s_ = saved.elapsed_s;
  last_saved_step_ = saved.step;
  spdlog::info("resumed from {} at step {} ({} tokens)", folder, saved.step, saved.tokens);
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
  return ms_since(start_) / 1000.0;
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
      batches.push_back(to_device(std::move(batch), device_));
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
      Autocast autocast(bf16, device_, /*keep_cache=*/keep_casts);
      loss = model_->forward_loss(batches[a].inputs, batches[a].targets);
    }
    if (inject_nan && a == 0) loss = loss * std::numeric_limits<float>::quiet_NaN();
    m.forward_ms += ms_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    sync_phase("backward");
    {
      trace::Scope range("backward");
      (loss * scale).backward();
    }
    m.backward_ms += ms_since(t1);
    if (!last && dp_->zero_stage() >= 2) {
      const auto tc = std::chrono::steady_clock::now();
      sync_phase("gradient sync");
      trace::Scope range("wait for gradient sync");
      dp_->finish_gradient_sync();
      m.comm_ms += ms_since(tc);
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
  m.comm_ms += ms_since(t2);
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
    dp_->all_gather_params();  // stage 1: every rank's updated slices into every replica
    m.optimizer_ms = ms_since(t3);
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
  m.step_ms = ms_since(t_step);
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

LanguageModel& Trainer::model() {
  if (dp_) dp_->wait_params();
  return *model_;
}

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
    batch = to_device(std::move(batch), device_);
    Autocast autocast(r.train.precision == "bf16", device_);
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
  spdlog::info("saved checkpoint {} ({:.0f} ms)", out, ms_since(t0));
  return out;
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
