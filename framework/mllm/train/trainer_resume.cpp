// Resume: whether a run starts afresh or resumes, from which checkpoint (checkpoint.resume: auto,
// none or a folder), which recipe keys may change on resume (and which of those change training,
// logged as an event), and restoring weights, optimizer, sampler and RNG state from a checkpoint.
#include "mllm/train/trainer.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/optim/optimizer.h"

namespace fs = std::filesystem;

namespace mllm {
namespace {

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

// What differs between the corpus files a checkpoint trained on and those of this run, one
// line per file: changed contents (same path), files gone, files new; a mixture's lines name
// the data.sources entry. Empty when they are the same files with the same contents.
std::string corpus_changes(const std::vector<CorpusFileRecord>& before,
                           const std::vector<CorpusFileRecord>& now,
                           const std::vector<DataSource>& sources) {
  auto where = [&](const CorpusFileRecord& f) {
    if (sources.empty()) return f.path;
    const std::string name =
        size_t(f.source) < sources.size() ? sources[size_t(f.source)].name : "";
    return fmt::format("{} (data.sources[{}]{})", f.path, f.source,
                       name.empty() ? "" : " '" + name + "'");
  };
  std::string out;
  for (const auto& b : before) {
    auto it = std::find_if(now.begin(), now.end(), [&](const CorpusFileRecord& n) {
      return n.path == b.path && n.source == b.source;
    });
    if (it == now.end())
      out += fmt::format("\n  {}: no longer in the corpus", where(b));
    else if (it->size != b.size || it->hash != b.hash)
      out += fmt::format("\n  {}: its contents changed ({} bytes, hash {:016x} at the checkpoint; "
                         "{} bytes, hash {:016x} now)",
                         where(b), b.size, b.hash, it->size, it->hash);
  }
  for (const auto& n : now)
    if (std::none_of(before.begin(), before.end(), [&](const CorpusFileRecord& b) {
          return n.path == b.path && n.source == b.source;
        }))
      out += fmt::format("\n  {}: new in the corpus", where(n));
  return out;
}

}  // namespace

// A resume on other data would go on silently with another data order (the sampler's position
// is an index into the sequences): refused unless checkpoint.allow_data_change says it is meant.
void Trainer::check_resumed_data(const std::string& folder, const TrainState& saved) {
  if (saved.data_fingerprint.empty()) {
    spdlog::info("resuming from {}: it records no data fingerprint (saved before 2026-12-07), so "
                 "whether the corpus changed since cannot be checked", folder);
    return;
  }
  if (saved.data_fingerprint == state_.data_fingerprint) return;
  std::string changes =
      corpus_changes(saved.corpus_files, state_.corpus_files, recipe_.data.sources);
  if (changes.empty())
    changes = "\n  the same files with the same contents: the data settings (data.*) or the "
              "cache format of this mllm version differ";
  const std::string what = fmt::format(
      "the training data changed since {} was saved (data fingerprint {} then, {} now):{}", folder,
      saved.data_fingerprint, state_.data_fingerprint, changes);
  if (!recipe_.checkpoint.allow_data_change)
    throw CheckpointError(fmt::format(
        "cannot resume: {}\nrestore those files, or set checkpoint.allow_data_change=true to "
        "resume on the new data (the sampler's position then points into other sequences)",
        what));
  spdlog::warn("resuming on changed data (checkpoint.allow_data_change=true): {}", what);
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

void Trainer::resume_from(const std::string& folder) {
  TrainState saved = read_train_state(folder);
  check_resumed_data(folder, saved);  // first: it names the files whose change is the cause
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

}  // namespace mllm
