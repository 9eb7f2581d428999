// Checkpoints: one folder per save (checkpoints/step_NNNNNN/) holding everything needed to
// resume exactly, written atomically (temporary folder, fsync, rename; `latest` moves last) and
// verified on load against a manifest of sizes and CRC-32 checksums.
//
// Folder contents:
//   model.pt            weights (torch::serialize archive, parameter names as in the model)
//   model.safetensors   the same weights for Python (safetensors layout, see docs/checkpoints.md)
//   optimizer.pt        optimizer state (AdamW moments and step counts)
//   state.json          step, tokens, sampler position, world size, elapsed seconds, lr, ...
//   rng_rank_NN.pt      each rank's CPU generator state (dropout)
//   rng_rank_NN.cuda.pt each rank's GPU generator state, when it trained on a GPU
//   recipe.yaml         the resolved recipe of the run that saved it
//   tokenizer.<ext>     a copy of the tokenizer file
//   manifest.json       every file above with its size in bytes and CRC-32
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/core/recipe.h"
#include "mllm/data/prepare.h"
#include "mllm/data/sampler.h"
#include "mllm/distributed/communicator.h"
#include "mllm/optim/optimizer.h"

namespace mllm {

// The non-tensor training state saved in state.json.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t tokens = 0;            // tokens processed so far (global, input positions)
  SamplerState sampler;          // global sampler position after `step` steps
  int world_size = 1;            // world size of the run that saved
  double elapsed_s = 0;          // training wall time so far, seconds (all invocations)
  double lr = 0;                 // lr of the last step taken (informational)
  int64_t nonfinite_skips = 0;   // updates skipped so far (train.on_nonfinite=skip)
  uint64_t tokenizer_fingerprint = 0;
  // The data the run trained on: the data fingerprint (data/prepare.h) and its corpus files
  // (path, data.sources index, size, content hash). Empty in checkpoints saved before
  // 2026-12-07, whose resume then cannot check the data.
  std::string data_fingerprint;
  std::vector<CorpusFileRecord> corpus_files;
};

// One piece of a parameter whose AdamW state an optimizer holds: elements [begin, end) of the
// flattened parameter `name` (param_numel elements in all), updated through `tensor` (the
// optimizer's parameter for it, 1-D [end - begin]). ZeRO stage 1 gives each rank the pieces of
// its bucket slices (DataParallel::shard_segments); a whole parameter is the piece [0, numel).
struct OptimizerPiece {
  std::string name;
  int64_t begin = 0, end = 0, param_numel = 0;
  torch::Tensor tensor;
};

// Name of the folder for `step`: "step_000500".
std::string checkpoint_name(int64_t step);

// Saves a checkpoint of `step` under `checkpoints_dir`. Collective: every rank calls it with its
// own module/optimizer (identical across ranks) and writes its RNG state; rank 0 writes the rest.
// Keeps the newest `keep_last` checkpoints up to this step and removes those past it (an
// abandoned continuation). Returns the final folder path.
// `shard` (ZeRO stages 1 and 2): this rank's optimizer pieces. Then every rank writes its own
// AdamW state to optimizer_rank_NN.pt (no optimizer.pt), and manifest.json lists each rank's
// pieces under "optimizer_shards" ({"zero_stage": `zero_stage`, "world_size": N, "ranks": [{"file", "pieces":
// [{"param", "begin", "end", "numel", "state"}]}]}); every rank must pass its own.
// Throws mllm::Error (exit 1, not bad input) naming the file when a write fails ("cannot write
// <file>: No space left on device"); rank 0 then removes the temporary folder, and `latest`
// and earlier checkpoints stay as they were. MLLM_FAULT kill/enospc (core/fault.h) inject
// failures here for the tests.
std::string save_checkpoint(Communicator& comm, const std::string& checkpoints_dir,
                            const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, const std::string& recipe_yaml,
                            const std::string& tokenizer_path, int64_t keep_last,
                            const std::vector<OptimizerPiece>* shard = nullptr,
                            int zero_stage = 1);

// Removes what an interrupted save left in `checkpoints_dir` (.tmp_step_* folders, .latest.tmp)
// and returns their names. Call only while holding the run-folder lock (train/run_lock.h).
std::vector<std::string> remove_interrupted_saves(const std::string& checkpoints_dir);

// Checks the manifest: every listed file present, same size, same CRC-32.
// Throws CheckpointError naming the folder and the first bad file (missing, truncated,
// checksum mismatch) or a missing/unparsable manifest.
void verify_checkpoint(const std::string& folder);

// Picks the checkpoint to resume from. `resume`: "none" -> nullopt; "auto" -> the folder named
// by checkpoints_dir/latest if it verifies, else the newest step_* folder that verifies (with a
// warning naming what was skipped and why), else nullopt; any other value is a path (a
// checkpoint folder, a `latest` file, or a checkpoints dir / run dir containing `latest`) that
// must verify — otherwise CheckpointError, which says what the path is when it is no
// checkpoint (missing, a run folder without checkpoints, step folders without `latest`).
std::optional<std::string> find_resume_checkpoint(const std::string& resume,
                                                  const std::string& checkpoints_dir);

// A checkpoint named on a command line (--checkpoint of mllm-generate, -eval, -export): the folder
// `path` resolves to (as find_resume_checkpoint; "auto" and "none" are refused, a path is
// needed) and the recipe saved in it. The recipe's `plugins:` are loaded first (paths relative
// to the working directory); `plugins`, when given (--plugins), are loaded instead and replace
// that list (a plugin that moved since training). Throws CheckpointError for a bad path or
// checkpoint, ConfigError for a recipe this build cannot read or a plugin that cannot load (a
// saved plugin path missing from here: naming it and suggesting --plugins).
struct OpenedCheckpoint {
  std::string folder;
  Recipe recipe;
};
OpenedCheckpoint open_checkpoint(const std::string& path,
                                 const std::optional<std::vector<std::string>>& plugins = {});

// Readers for a verified folder. Each throws CheckpointError naming the file on failure.
TrainState read_train_state(const std::string& folder);
std::string read_checkpoint_recipe(const std::string& folder);     // recipe.yaml text
std::string checkpoint_tokenizer_path(const std::string& folder);  // tokenizer.* path
// Weights and optimizer state are loaded onto the device of the model's / optimizer's
// parameters, whatever device wrote them (a GPU checkpoint resumes on the CPU and back).
void load_model_weights(const std::string& folder, torch::nn::Module& model);
void load_optimizer_state(const std::string& folder, torch::optim::Optimizer& optimizer);
// True when the checkpoint's optimizer state is sharded (written at dist.zero_stage 1).
bool has_sharded_optimizer_state(const std::string& folder);
// Re-sharding load, for any saved layout into any target layout: the checkpoint's AdamW state
// (optimizer.pt of a stage-0 run, read through a temporary "adamw" optimizer over `model_params`
// with `cfg`'s groups; or every rank file of a stage-1 run, at any world size) is cut to the
// `targets` pieces and set as `optimizer`'s state for each piece's tensor (moments shaped like
// the tensor, on its device; a piece whose parameter had no state gets none). Every rank reads
// what it needs (briefly all of the state: the files are read whole). Throws CheckpointError
// naming the file for a missing or unreadable file, saved pieces that cover a target piece only
// in part, or pieces of one parameter with different step counts.
void load_optimizer_state_resharded(const std::string& folder, torch::optim::Optimizer& optimizer,
                                    const std::vector<OptimizerPiece>& targets,
                                    const std::vector<NamedParam>& model_params,
                                    const OptimConfig& cfg);
// Restores this rank's CPU generator, and on a CUDA `device` also that GPU's generator when the
// checkpoint holds its state; returns false (state untouched) if the file for `rank` is absent
// (resuming at another world size).
bool load_rng_state(const std::string& folder, int rank,
                    const torch::Device& device = torch::Device(torch::kCPU));

// Writes `model`'s parameters as a .safetensors file (all F32 unless the tensors are BF16):
// 8-byte little-endian header size, JSON header {name: {dtype, shape, data_offsets}}, raw data.
// Format: https://github.com/huggingface/safetensors (README "Format"). Throws mllm::Error
// "cannot write <path>: ..." when writing fails; `inject_errno` (tests) makes every write fail.
void export_safetensors(torch::nn::Module& model, const std::string& path, int inject_errno = 0);

// The same file format for named tensors in the given order (F32, or BF16 tensors as BF16; other
// dtypes are written as F32). Throws as export_safetensors.
void write_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::string& path, int inject_errno = 0);

}  // namespace mllm
