// The training loop: build from the recipe, resume, micro-steps with gradient accumulation,
// synced clipping, AdamW, lr schedule, callbacks, checkpointed early stops.
#include "mllm/train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <thread>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/core/plugin.h"
#include "mllm/data/prepare.h"
#include "mllm/model/generate.h"
#include "mllm/model/loss.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/builtins.h"
#include "mllm/train/device.h"

namespace fs = std::filesystem;

namespace mllm {
namespace {

std::atomic<bool> g_stop_signal{false};

extern "C" void on_stop_signal(int) { g_stop_signal.store(true); }

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

// bf16 autocast on `device`'s type for the scope; restores the previous autocast state on exit.
class Autocast {
 public:
  Autocast(bool enabled, const torch::Device& device) : enabled_(enabled), type_(device.type()) {
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
    at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_;
  at::DeviceType type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// The batch on `device`: pinned host memory and a non-blocking copy for a GPU.
Batch to_device(Batch b, const torch::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.pin_memory().to(device, /*non_blocking=*/true);
  b.targets = b.targets.pin_memory().to(device, /*non_blocking=*/true);
  return b;
}

// Recipe keys that may change between a checkpoint and the run resuming it. Everything else
// (model shape, tokenizer, data, batch sizes, optimizer, seed) would silently change the run.
bool may_change_on_resume(const std::string& key) {
  static const char* kAllowed[] = {"run.name", "run.out_dir", "train.max_steps",
                                   "train.stop_at_step", "train.time_limit_s", "train.threads",
                                   "train.device", "train.tf32", "model.attn_impl",
                                   "callbacks", "plugins", "checkpoint.", "eval.", "sample.",
                                   "log.", "dist."};
  for (const char* a : kAllowed) {
    std::string p(a);
    if (p.back() == '.' ? key.rfind(p, 0) == 0 : key == p) return true;
  }
  return false;
}

// Rewrites metrics.jsonl without the lines whose "step" is greater than `step`.
void drop_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> keep;
  bool dropped = false;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    // Lines past the checkpoint, and a line torn by the crash, go.
    if (j.is_discarded() || (j.contains("step") && j["step"].get<int64_t>() > step)) dropped = true;
    else keep.push_back(line);
  }
  in.close();
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& line : keep) out << line << "\n";
    if (!out) throw Error("cannot rewrite " + path + " (disk full?)");
  }
  fs::rename(tmp, path);  // atomic: a crash leaves the old file or the new one
}

// Every registry name the recipe uses exists — checked before anything is written, so a typo
// in model.type costs no data preparation and leaves no run folder behind.
void check_component_names(const Recipe& r) {
  auto check = [&](const auto& registry, const std::string& name, const std::string& key) {
    try {
      registry.require(name);
    } catch (const ConfigError& e) {
      throw ConfigError(r.source + ": " + key + ": " + e.what());
    }
  };
  check(tokenizer_registry(), r.data.tokenizer.type, "data.tokenizer.type");
  check(model_registry(), r.model.type, "model.type");
  check(optimizer_registry(), r.optim.type, "optim.type");
  check(lr_schedule_registry(), r.schedule.type, "schedule.type");
  for (const auto& name : r.callbacks) check(callback_registry(), name, "callbacks");
}

}  // namespace

const char* to_string(StopReason r) {
  switch (r) {
    case StopReason::kMaxSteps: return "reached train.max_steps";
    case StopReason::kStopAtStep: return "reached train.stop_at_step";
    case StopReason::kTimeLimit: return "reached train.time_limit_s";
    case StopReason::kSignal: return "received a stop signal (SIGTERM/SIGINT/SIGUSR1/SIGUSR2)";
  }
  return "?";
}

void install_stop_signal_handlers() {
  // SIGUSR1/SIGUSR2 too: mpirun forwards those to every rank, while on SIGTERM/SIGINT it
  // signals the ranks itself and SIGKILLs them after odls_base_sigkill_timeout seconds.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) std::signal(sig, on_stop_signal);
}

bool stop_signal_received() { return g_stop_signal.load(); }

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

double measure_peak_flops(bool bf16, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  auto opts = torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32).device(device);
  // Constant operands: the timing does not depend on values, and drawing random ones would
  // advance the default generator and break bit-exact resume of dropout.
  torch::Tensor a = torch::full({n, n}, 0.5, opts);
  torch::Tensor b = torch::full({n, n}, 0.25, opts);
  torch::mm(a, b);  // warm up (thread pool, oneDNN kernels, cuBLAS handles)
  synchronize(device);
  double best_s = 1e30;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    torch::mm(a, b);
    synchronize(device);
    best_s = std::min(best_s, ms_since(t0) / 1000.0);
  }
  return 2.0 * n * n * n / best_s;
}

Trainer::Trainer(Recipe recipe, std::shared_ptr<Communicator> comm)
    : recipe_(std::move(recipe)), comm_(std::move(comm)), start_(std::chrono::steady_clock::now()) {
  validate_for_world(recipe_, comm_->world_size());
  register_builtins();
  load_plugins(recipe_.plugins);  // before anything is built: plugins may provide any part
  check_component_names(recipe_);
  run_dir_ = recipe_.run.out_dir;
  build();
}

Trainer::~Trainer() = default;

void Trainer::build() {
  const Recipe& r = recipe_;
  Communicator& comm = *comm_;
  const int rank = comm.rank(), world = comm.world_size();

  // Every rank must run the same recipe: a difference (a stale file on one node, an override
  // given to one rank) would silently desynchronise the replicas.
  auto hashes = comm.all_gather(fmt::format("{:016x}", recipe_hash(r)));
  for (int i = 1; i < world; ++i)
    if (hashes[i] != hashes[0])
      throw ConfigError(fmt::format("rank {} resolved a different recipe than rank 0 (hash {} vs "
                                    "{}); give every rank the same recipe and overrides",
                                    i, hashes[i], hashes[0]));

  // Resume decision (rank 0 reads the folder; everyone follows its answer).
  std::string resume_folder;
  if (rank == 0) {
    resume_folder = find_resume_checkpoint(r.checkpoint.resume, checkpoints_dir()).value_or("");
    // A fresh start over another run's checkpoints would mix two runs in one folder (and
    // keep_last could delete the new saves in favour of the old run's higher steps).
    if (r.checkpoint.resume == "none" && fs::exists(checkpoints_dir() + "/latest"))
      throw ConfigError(fmt::format(
          "{}: checkpoint.resume=none but {} already holds checkpoints of a run; choose another "
          "run.out_dir, delete that folder, or resume (checkpoint.resume=auto)",
          r.source, checkpoints_dir()));
  }
  resume_folder = comm.all_gather(resume_folder)[0];
  if (!resume_folder.empty()) {
    Recipe saved = load_recipe_string(read_checkpoint_recipe(resume_folder),
                                      resume_folder + "/recipe.yaml");
    std::string breaking;
    for (const auto& d : recipe_diff(saved, r))
      if (!may_change_on_resume(d.key))
        breaking += fmt::format("\n  {}: checkpoint {} -> recipe {}", d.key, d.a, d.b);
    if (!breaking.empty())
      throw CheckpointError("cannot resume from " + resume_folder +
                            ": the recipe changed in ways that break the run:" + breaking +
                            "\nrestore these values, or start a new run (checkpoint.resume=none "
                            "or another run.out_dir)");
  }

  // Run folder, logs, resolved recipe: only now that the recipe is known to be valid.
  fs::create_directories(run_dir_);
  init_logging(rank, world, resolve_log_level(r.log.level), run_dir_ + "/logs");
  install_stop_signal_handlers();
  const int threads = resolve_threads(r.train.threads, comm.local_size());
  torch::set_num_threads(threads);
  spdlog::info("run {}: world size {} ({} backend), {} threads per rank, recipe {}", r.run.name,
               world, comm.backend(), threads, r.source);
  device_ = rank_device(resolve_device_type(r.train.device, r.source), comm.local_rank());
  if (device_.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(r.train.tf32);
    at::globalContext().setAllowTF32CuDNN(r.train.tf32);
  }
  spdlog::info("{}", describe_libtorch(device_));

  // Data: rank 0 tokenizes and writes shards once; the others wait at the barrier.
  int64_t need_prepare = 0;
  if (rank == 0) {
    need_prepare = !is_prepared(r.data);
    // Removed before the other ranks hear about it, so that their wait below cannot mistake a
    // stale manifest for the new one.
    if (need_prepare) fs::remove(manifest_path(r.data));
  }
  need_prepare = comm.all_gather(need_prepare)[0];
  if (need_prepare) {
    if (rank == 0) {
      spdlog::info("preparing data into {} (tokenizer + shards)", r.data.cache_dir);
      // All cores: the other ranks of this node only wait meanwhile.
      prepare_data(r.data, usable_cpus(), isatty(STDERR_FILENO));
    } else {
      // Why poll instead of a barrier: preparing a large corpus (BPE training) can outlast
      // dist.timeout_s, which bounds every collective. The manifest is written last.
      while (!fs::exists(manifest_path(r.data)))
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    comm.barrier();  // Why: no rank may open shards before rank 0 has renamed them into place.
  }
  const PreparedData paths = prepared_paths(r.data);
  tokenizer_path_ = paths.tokenizer_path;
  tokenizer_ = load_tokenizer(paths.tokenizer_path);
  train_data_ = std::make_unique<TokenDataset>(paths.train_shard, r.data.mode, r.data.seq_len);
  val_data_ = std::make_unique<TokenDataset>(paths.val_shard, r.data.mode, r.data.seq_len);
  train_data_->check_tokenizer(*tokenizer_);
  val_data_->check_tokenizer(*tokenizer_);
  state_.tokenizer_fingerprint = tokenizer_->fingerprint();
  spdlog::info("data: vocab {}, {} train sequences, {} val sequences of {} tokens ({} mode)",
               tokenizer_->vocab_size(), train_data_->size(), val_data_->size(), r.data.seq_len,
               r.data.mode);

  // Model: identical initialisation on every rank (same seed), then broadcast + verify anyway.
  torch::manual_seed(static_cast<uint64_t>(r.run.seed));
  model_ = model_registry().create(r.model.type, r.model, tokenizer_->vocab_size(), r.max_seq_len());
  model_->to(device_);  // initialised on the CPU first: the same weights on every device
  flops_per_token_ = model_->flops_per_token(r.data.seq_len);
  dp_ = std::make_unique<DataParallel>(model_, comm_,
                                       static_cast<int64_t>(r.dist.bucket_mb * 1024 * 1024));
  dp_->broadcast_and_verify();
  spdlog::info("model {}: {} parameters, {} FLOPs per token (fwd+bwd)", r.model.type,
               model_->num_params(), flops_per_token_);

  std::vector<NamedParam> params;
  for (const auto& p : model_->named_parameters())
    params.push_back({p.key(), p.value(), model_->is_embedding(p.key())});
  optimizer_ = optimizer_registry().create(r.optim.type, r.optim, params);
  schedule_ = lr_schedule_registry().create(r.schedule.type, r.schedule, r.optim.lr,
                                            r.train.max_steps);
  if (r.schedule.warmup_steps >= r.train.max_steps && r.schedule.warmup_steps > 0)
    spdlog::warn("schedule.warmup_steps={} >= train.max_steps={}: the lr ramps for the whole run "
                 "and reaches {:.3g} (of optim.lr={:.3g}) at the last step", r.schedule.warmup_steps,
                 r.train.max_steps, schedule_->lr(r.train.max_steps - 1), r.optim.lr);
  sampler_ = std::make_unique<DistributedSampler>(train_data_->size(), r.train.global_batch,
                                                  r.train.micro_batch, rank, world,
                                                  static_cast<uint64_t>(r.run.seed));
  // Dropout masks differ per rank (as with independent DDP processes) but are reproducible.
  torch::manual_seed(static_cast<uint64_t>(r.run.seed) + 7919ull * (rank + 1));
  state_.world_size = world;
  if (!resume_folder.empty()) resume_from(resume_folder);

  if (rank == 0) {
    std::ofstream(run_dir_ + "/recipe.resolved.yaml") << to_yaml(r);
    // Lines logged after the checkpoint we resume from (a crash between saves) are replayed
    // by this run; drop them so every step appears once.
    drop_metrics_after(run_dir_ + "/metrics.jsonl", state_.step);
    metrics_.open(run_dir_ + "/metrics.jsonl", std::ios::app);
    if (!metrics_) throw Error("cannot open " + run_dir_ + "/metrics.jsonl for writing");
  }
  for (const auto& name : r.callbacks) callbacks_.push_back(callback_registry().create(name, r));
  // MFU denominator: every rank times a GEMM at the same moment (after a barrier), so ranks
  // sharing cores measure their real share, and the shares add up to the job's peak.
  comm.barrier();
  torch::Tensor peak = torch::tensor({measure_peak_flops(r.train.precision == "bf16", device_)},
                                     torch::kFloat64);
  comm.all_reduce(peak, ReduceOp::kSum);
  peak_flops_ = peak.item<double>();
}

void Trainer::resume_from(const std::string& folder) {
  TrainState saved = read_train_state(folder);
  if (saved.tokenizer_fingerprint != state_.tokenizer_fingerprint)
    throw CheckpointError(fmt::format(
        "cannot resume from {}: its tokenizer (fingerprint {:016x}) differs from the one in {} "
        "({:016x}); the data was re-prepared differently", folder, saved.tokenizer_fingerprint,
        recipe_.data.cache_dir, state_.tokenizer_fingerprint));
  load_model_weights(folder, *model_);
  load_optimizer_state(folder, *optimizer_);
  sampler_->load_state(saved.sampler);
  bool rng = load_rng_state(folder, comm_->rank(), device_);
  if (saved.world_size != comm_->world_size())
    spdlog::warn("resuming a {}-rank checkpoint with {} ranks: same global batches, but dropout "
                 "RNG streams are re-seeded", saved.world_size, comm_->world_size());
  else if (!rng)
    throw CheckpointError("checkpoint " + folder + " has no RNG state for rank " +
                          std::to_string(comm_->rank()));
  state_.step = saved.step;
  state_.tokens = saved.tokens;
  state_.sampler = saved.sampler;
  state_.elapsed_s = saved.elapsed_s;
  state_.lr = saved.lr;
  elapsed_at_start_s_ = saved.elapsed_s;
  last_saved_step_ = saved.step;
  spdlog::info("resumed from {} at step {} ({} tokens)", folder, saved.step, saved.tokens);
}

double Trainer::seconds_running() const {
  return ms_since(start_) / 1000.0;
}

StopReason Trainer::run() {
  const Recipe& r = recipe_;
  for (auto& cb : callbacks_) cb->on_train_begin(*this);
  StopReason reason = StopReason::kMaxSteps;
  while (state_.step < r.train.max_steps) {
    if (r.train.stop_at_step && state_.step >= *r.train.stop_at_step) {
      reason = StopReason::kStopAtStep;
      break;
    }
    StepMetrics m = train_step();
    for (auto& cb : callbacks_) cb->on_step_end(*this, m);
    if (stop_reason_) {
      reason = *stop_reason_;
      break;
    }
  }
  if (reason == StopReason::kMaxSteps && r.train.stop_at_step &&
      state_.step >= *r.train.stop_at_step && state_.step < r.train.max_steps)
    reason = StopReason::kStopAtStep;
  spdlog::info("stopping at step {}: {}", state_.step, to_string(reason));
  // An early stop always leaves a checkpoint to resume from, whatever callbacks are listed.
  if (reason != StopReason::kMaxSteps) save_checkpoint();
  for (auto& cb : callbacks_) cb->on_train_end(*this, reason);
  if (metrics_.is_open()) metrics_.flush();
  return reason;
}

StepMetrics Trainer::train_step() {
  const Recipe& r = recipe_;
  const auto t_step = std::chrono::steady_clock::now();
  StepMetrics m;
  m.lr = schedule_->lr(state_.step);
  set_lr(*optimizer_, m.lr);

  std::vector<Batch> batches;
  int64_t local_targets = 0;
  for (const auto& ids : sampler_->next_step()) {
    Batch batch = train_data_->get(ids);
    local_targets += count_targets(batch.targets);
    batches.push_back(to_device(std::move(batch), device_));
  }
  int64_t global_targets = 0;
  const double scale = dp_->loss_scale(local_targets, &global_targets);
  MLLM_CHECK(global_targets > 0, "a global batch without any target token");

  model_->train();
  optimizer_->zero_grad();
  // Summed on the device in float64 (no host round trip per micro-step); on the CPU the same
  // additions in the same order as summing item<double>() values.
  torch::Tensor local_loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(device_));
  for (std::size_t a = 0; a < batches.size(); ++a) {
    // Why: only the last micro-step all-reduces; earlier ones just accumulate locally.
    dp_->set_sync(a + 1 == batches.size());
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor loss;
    {
      Autocast autocast(r.train.precision == "bf16", device_);
      loss = lm_loss_sum(model_->forward(batches[a].inputs), batches[a].targets);
    }
    m.forward_ms += ms_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    (loss * scale).backward();
    m.backward_ms += ms_since(t1);
    local_loss_sum += loss.detach().to(torch::kFloat64);
  }
  auto t2 = std::chrono::steady_clock::now();
  dp_->finish_gradient_sync();
  m.comm_ms = ms_since(t2);
  m.grad_norm = dp_->clip_grad_norm(r.optim.grad_clip);
  // Identical on every rank (synced gradients), so all ranks stop together, before a NaN
  // update can reach the weights and a checkpoint.
  if (!std::isfinite(m.grad_norm))
    throw Error(fmt::format("gradient norm is {} at step {}; nothing was updated — lower "
                            "optim.lr, or resume from the last checkpoint", m.grad_norm,
                            state_.step + 1));
  auto t3 = std::chrono::steady_clock::now();
  optimizer_->step();
  m.optimizer_ms = ms_since(t3);

  // One small collective per step: the global loss sum and the stop votes (a signal on any
  // rank, the time limit on any rank), so every rank stops after the same step, for one reason.
  const bool timed_out = r.train.time_limit_s && seconds_running() >= *r.train.time_limit_s;
  torch::Tensor red = torch::tensor(
      {local_loss_sum.item<double>(), stop_signal_received() ? 1.0 : 0.0, timed_out ? 1.0 : 0.0},
      torch::kFloat64);
  comm_->all_reduce(red, ReduceOp::kSum);
  if (red[1].item<double>() > 0) stop_reason_ = StopReason::kSignal;
  else if (red[2].item<double>() > 0) stop_reason_ = StopReason::kTimeLimit;

  state_.step += 1;
  state_.tokens += r.train.global_batch * r.data.seq_len;
  state_.sampler = sampler_->state();
  state_.lr = m.lr;
  m.step = state_.step;
  m.tokens = state_.tokens;
  m.target_tokens = global_targets;
  m.loss = red[0].item<double>() / static_cast<double>(global_targets);
  m.step_ms = ms_since(t_step);
  m.tokens_per_s = r.train.global_batch * r.data.seq_len / (m.step_ms / 1000.0);
  m.mfu = peak_flops_ > 0 ? flops_per_token_ * m.tokens_per_s / peak_flops_ : 0.0;
  if (!std::isfinite(m.loss))
    throw Error(fmt::format("loss is {} at step {}; lower optim.lr or check the data", m.loss,
                            m.step));
  return m;
}

EvalMetrics Trainer::evaluate() {
  const Recipe& r = recipe_;
  torch::NoGradGuard no_grad;
  model_->eval();
  double sum = 0, count = 0;
  for (int64_t b = 0; b < r.eval.batches; ++b) {
    auto ids = val_batch_indices(val_data_->size(), b, r.train.micro_batch, comm_->rank(),
                                 comm_->world_size());
    if (ids.empty()) continue;
    Batch batch = val_data_->get(ids);
    count += static_cast<double>(count_targets(batch.targets));
    batch = to_device(std::move(batch), device_);
    Autocast autocast(r.train.precision == "bf16", device_);
    sum += lm_loss_sum(model_->forward(batch.inputs), batch.targets).item<double>();
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
  return e;
}

std::string Trainer::save_checkpoint() {
  const std::string folder = checkpoints_dir() + "/" + checkpoint_name(state_.step);
  if (last_saved_step_ == state_.step) return folder;
  state_.elapsed_s = elapsed_at_start_s_ + seconds_running();
  auto t0 = std::chrono::steady_clock::now();
  std::string out = mllm::save_checkpoint(*comm_, checkpoints_dir(), state_, *model_,
                                          *optimizer_, to_yaml(recipe_), tokenizer_path_,
                                          recipe_.checkpoint.keep_last);
  last_saved_step_ = state_.step;
  spdlog::info("saved checkpoint {} ({:.0f} ms)", out, ms_since(t0));
  return out;
}

std::vector<std::string> Trainer::generate_samples() {
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

void Trainer::write_metrics_line(const std::string& json_line) {
  if (!metrics_.is_open()) return;
  metrics_ << json_line << "\n";
  metrics_.flush();
}

}  // namespace mllm
