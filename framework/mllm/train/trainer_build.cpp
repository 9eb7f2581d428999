// Building a run from its recipe (Trainer::build): a list of named phases, each a member function,
// in order — same-recipe check, run-folder lock, resume decision, logging and start-up lines,
// data, model (DataParallel, ZeRO stage 3's block hooks), optimizer, schedule and sampler, resume,
// run outputs, callbacks, the MFU peak.
#include "mllm/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include <ATen/Context.h>
#include <torch/version.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/blas.h"
#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/prepare.h"
#include "mllm/distributed/prepare_group.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/device.h"
#include "mllm/train/mfu.h"
#include "mllm/train/profiler.h"
#include "mllm/train/tensorboard.h"
#include "mllm/train/trainer_internal.h"

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

// ZeRO stage 3: the model's per-block hook points drive DataParallel's gathers and frees.
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
    std::vector<double> weights;
    for (const auto& s : r.data.sources) weights.push_back(s.weight);
    const std::vector<double> shares = mixture_shares(weights);
    for (size_t k = 0; k < paths.sources.size(); ++k) {
      source_data_.push_back(std::make_unique<TokenDataset>(paths.sources[k].train_shards,
                                                            r.data.mode, r.data.seq_len));
      source_data_.back()->check_tokenizer(*tokenizer_);
      source_offsets_.push_back(train_sequences);
      train_sequences += source_data_.back()->size();
      spdlog::info("data source {} '{}': {} train sequences, weight {} ({:.1f}% of the draws)", k,
                   r.data.sources[k].name, source_data_.back()->size(), r.data.sources[k].weight,
                   100.0 * shares[k]);
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
  state_.data_fingerprint = paths.data_fingerprint;
  state_.corpus_files = paths.corpus_files;
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
  detail::drop_metrics_after(run_dir_ + "/metrics.jsonl", state_.step);
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

}  // namespace mllm
