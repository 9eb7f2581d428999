// The recipe: one YAML file per experiment, read into typed, validated config structs.
// Every key is declared once (recipe_schema.cpp) with its type, default and help; unknown or
// misplaced keys, wrong types and out-of-range values are rejected before anything runs.
// Key reference: docs/recipe.md (generated from the same table by `mllm-train --help-recipe`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mllm/core/options.h"

namespace mllm {

struct RunConfig {
  std::string name = "mini";
  std::string out_dir = "runs/mini";  // run folder; relative to the working directory
  int64_t seed = 1337;
};

struct TokenizerConfig {
  std::string type = "char";   // registry name: char | bpe
  int64_t vocab_size = 8000;   // bpe: target vocabulary size (tokens, specials included)
  double character_coverage = 0;  // bpe: sentencepiece's character_coverage; 0 = automatic
  int64_t min_count = 1;       // char: drop characters seen fewer times (they become <UNK>)
  int64_t max_vocab = 0;       // char: keep at most this many tokens (0 = no limit)
  int64_t sample_bytes = int64_t(12) << 20;  // bpe: train on a deterministic sample of this many bytes
  Options options;             // data.tokenizer.options: what the tokenizer type declares (options.h)
};

// One source of a mixture (data.sources): its files, and how often its sequences are drawn.
struct DataSource {
  std::string name;                      // for logs and metrics; default "source<i>"
  std::vector<std::string> corpus;       // files or globs, as data.corpus
  double weight = 1.0;                   // > 0: share of sequences = weight / sum of weights
};

struct DataConfig {
  std::vector<std::string> corpus;       // .txt / .jsonl / .parquet files or globs, relative to cwd
                                         // (then to corpus_fallback_dir)
  std::vector<DataSource> sources;       // a mixture instead of data.corpus (empty = none)
  std::string text_field = "text";       // .jsonl field holding the document text
  std::string doc_separator = "line";    // .txt: line (one doc per line) | blank_line
  std::string invalid_utf8 = "error";    // error | replace (with U+FFFD)
  // Not recipe keys: how errors name the two options above (mllm-eval names its own flags).
  std::string corpus_option = "data.corpus";
  std::string invalid_utf8_fix = "set data.invalid_utf8: replace";
  // Not a recipe key: where a relative corpus path that matches nothing in the working directory
  // is looked up next (load_recipe: share_dir(), so a bundled recipe runs from any folder); ""
  // = the working directory only.
  std::string corpus_fallback_dir;
  TokenizerConfig tokenizer;
  std::string cache_dir = "data/cache/mini";  // <cache_dir>/<data fingerprint>/: tokenizer + shards
  int64_t shard_tokens = 100000000;      // tokens per shard file at most (llm.c: 100M)
  int64_t prepare_memory_mb = 1024;      // mllm-prepare's memory budget per rank (MiB)
  int64_t prepare_segment_bytes = int64_t(64) << 20;  // corpus bytes per unit of work of preparation
  double val_fraction = 0.01;            // share of documents held out for validation
  std::string mode = "packed";           // packed | document
  int64_t seq_len = 64;                  // tokens per training sequence
};

struct ModelConfig {
  std::string type = "minillm";  // registry name: minillm | llama
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;        // llama: key/value heads (0 = n_heads); must divide n_heads
  int64_t n_layers = 2;
  int64_t d_ff = 0;              // 0 = family default (minillm 4*d_model; llama SwiGLU rule)
  double dropout = 0.1;          // embedding and residual dropout
  std::optional<double> attn_dropout;  // on attention probabilities; null = dropout
  int64_t max_seq_len = 0;       // positions; 0 = data.seq_len
  double rope_theta = 10000.0;   // llama
  int64_t multiple_of = 32;      // llama: SwiGLU hidden size rounded up to this
  double norm_eps = 1e-5;        // LayerNorm / RMSNorm epsilon
  bool tie_embeddings = false;   // llama: share input embedding and output head
  double init_std = 0.02;        // normal init std; residual projections / sqrt(2 n_layers)
  std::string attn_impl = "auto";  // eager | sdpa | auto (sdpa on CUDA, eager on the CPU)
  std::string activation_checkpointing = "none";  // none | full | every_n (blocks recomputed in backward)
  int64_t checkpoint_every = 2;  // every_n: blocks 0, n, 2n, ... are checkpointed
  Options options;               // model.options: what the model type declares (options.h)
};

struct TrainConfig {
  int64_t max_steps = 2000;      // optimizer steps; the lr schedule always spans these
  int64_t global_batch = 64;     // sequences per optimizer step, all ranks together
  int64_t micro_batch = 8;       // sequences per rank per forward pass
  std::string device = "auto";   // auto | cpu | cuda
  std::string precision = "fp32";  // fp32 | bf16 (autocast, fp32 master weights)
  bool tf32 = true;              // CUDA: TF32 for fp32 matmuls (no effect on the CPU)
  bool sync_debug = false;       // CUDA: count host synchronisations per call stack (sync_debug.h)
  int64_t threads = 0;           // intra-op threads per rank; 0 = auto (cores / local ranks)
  std::optional<int64_t> stop_at_step;   // end this invocation after this step (checkpointed)
  std::optional<double> time_limit_s;    // end this invocation after this many seconds
  std::string on_nonfinite = "stop";     // non-finite loss / grad norm: stop | skip the update
  int64_t max_nonfinite_skips = 5;       // skip: stop after this many skipped updates in a row
};

struct OptimConfig {
  std::string type = "adamw";
  double lr = 5e-4;              // peak learning rate
  double weight_decay = 1e-5;
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  double grad_clip = 1.0;        // max global L2 norm; 0 disables clipping
  bool decay_bias_and_norm = false;   // apply weight decay to biases and norm weights
  bool decay_embeddings = false;      // apply weight decay to embedding tables
  Options options;               // optim.options: what the optimizer type declares (options.h)
};

struct ScheduleConfig {
  std::string type = "warmup_cosine";  // warmup_cosine | constant | linear
  int64_t warmup_steps = 100;
  double min_lr = 5e-5;
  Options options;               // schedule.options: what the schedule type declares (options.h)
};

struct DistConfig {
  std::string backend = "auto";  // auto | mpi | nccl | single
  double bucket_mb = 25.0;       // gradient bucket cap, MiB
  double timeout_s = 300.0;      // collective timeout before the job is aborted
  int64_t check_every_steps = 1000;  // replica check (hash of weights + optimizer state); 0 = off
  int64_t zero_stage = 0;        // 0: replicated AdamW state; 1: sharded over ranks (ZeRO stage 1); 2: gradients too; 3: parameters too
};

struct CheckpointConfig {
  int64_t every_steps = 500;     // 0 = only at the end / on signals
  int64_t keep_last = 3;
  std::string resume = "auto";   // auto | none | PATH
  // Resume although the corpus files' contents changed since the checkpoint (otherwise a
  // CheckpointError names the changed files): the data order after the resume then differs.
  bool allow_data_change = false;
};

struct EvalConfig {
  int64_t every_steps = 200;     // 0 = only at the end
  int64_t batches = 20;          // val batches of micro_batch sequences, split across ranks
};

struct SampleConfig {
  int64_t every_steps = 500;     // 0 = only at the end
  std::vector<std::string> prompts = {"春眠"};
  int64_t max_new_tokens = 48;
  double temperature = 0.8;      // 0 = greedy
  int64_t top_k = 50;            // 0 = off
  double top_p = 1.0;            // 1 = off
};

struct LogConfig {
  int64_t every_steps = 10;
  std::string level = "info";    // trace | debug | info | warn | error (MLLM_LOG_LEVEL wins)
  bool tensorboard = false;      // rank 0 also writes RUN/tensorboard/events.out.tfevents.*
};

struct ProfileConfig {
  // [FIRST, LAST]: record optimizer steps FIRST..LAST (1-based, as logged) with LibTorch's
  // profiler into RUN/profile/rank_NN.json; empty = off.
  std::vector<int64_t> steps;
  // Also record each op's input shapes and dtypes (the trace's "Input Dims" / "Input type"
  // args; torch.profiler's record_shapes): more overhead per op, so off by default.
  bool record_shapes = false;
};

// A whole experiment. Defaults above are the DESIGN.md defaults.
struct Recipe {
  std::vector<std::string> plugins;     // shared libraries to dlopen before building parts
  std::vector<std::string> callbacks = {"progress", "metrics", "eval", "samples", "checkpoint"};
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  OptimConfig optim;
  ScheduleConfig schedule;
  DistConfig dist;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  SampleConfig sample;
  LogConfig log;
  ProfileConfig profile;

  // Options of the callbacks that declare some (their plugins loaded), by callback name: each is
  // read from the top-level section named after its callback (options.h).
  std::map<std::string, Options> callback_options;

  std::string source;  // the recipe file it was loaded from (not a key)

  // The options of callback `name` (empty when it declares none).
  const Options& options_of_callback(const std::string& name) const;

  // Attention-probability dropout actually used: model.attn_dropout, or model.dropout if null.
  double attn_dropout() const { return model.attn_dropout.value_or(model.dropout); }
  // The position table size actually used: model.max_seq_len, or data.seq_len when 0.
  int64_t max_seq_len() const { return model.max_seq_len > 0 ? model.max_seq_len : data.seq_len; }
  // Micro-steps per optimizer step for `world_size` ranks. Requires validate_for_world().
  int64_t accumulation_steps(int world_size) const {
    return train.global_batch / (train.micro_batch * world_size);
  }
};

// The folder with the bundled recipes/, configs/ and data/: $MLLM_SHARE_DIR when set, else
// <folder of this program>/../share/mllm (an install: <prefix>/share/mllm; the build tree links
// build/share/mllm/{recipes,configs,data} to the sources); "" when /proc/self/exe is unreadable.
std::string share_dir();

// Loads, composes (defaults < file < overrides) and validates a recipe. Throws ConfigError
// naming file:line:col, the key path and what was expected (with a did-you-mean for typos).
// Relative paths (docs/recipe.md, "Paths"): `defaults:` entries against the listing file, else
// share_dir()/recipes; the recipe's data.corpus_fallback_dir is share_dir().
// The `plugins:` it lists are loaded (load_plugins) before the rest is read, because a plugin's
// components declare recipe keys of their own (options.h).
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text; `name` appears in errors, includes resolve against `base_dir`.
// `plugins`: kLoad dlopens the recipe's `plugins:` first (their option sections become valid
// keys); kAlreadyLoaded reads against what this process has loaded (a checkpoint's saved recipe,
// whose plugin paths may have moved since).
enum class RecipePlugins { kLoad, kAlreadyLoaded };
Recipe load_recipe_string(const std::string& yaml, const std::string& name = "<string>",
                          const std::vector<std::string>& overrides = {},
                          const std::string& base_dir = ".",
                          RecipePlugins plugins = RecipePlugins::kLoad);

// Checks that need the world size: global_batch divisible by micro_batch x world_size.
// Throws ConfigError with the fix (nearest valid global batches) when it is not.
void validate_for_world(const Recipe& recipe, int world_size);

// The resolved recipe as YAML text: every key, defaults filled in, in schema order. Loading it
// back with load_recipe_string() gives an equal Recipe (doubles printed round-trip exact).
std::string to_yaml(const Recipe& recipe);

// Stable 64-bit FNV-1a hash of to_yaml(recipe) (ranks compare it at start-up).
uint64_t recipe_hash(const Recipe& recipe);

// Every key as "path" -> value in YAML flow style ("optim.lr" -> "0.0005"), in schema order.
std::vector<std::pair<std::string, std::string>> flatten(const Recipe& recipe);

// One differing key between two recipes: path, value in `a`, value in `b`.
struct RecipeDifference {
  std::string key, a, b;
};
// Keys whose values differ, in the order of `a` then the keys only `b` has; a key present on one
// side only (another plugin component's options) shows "(absent)" on the other.
std::vector<RecipeDifference> recipe_diff(const Recipe& a, const Recipe& b);

// Markdown table of every key: path, type, default, help; then one table per component that
// declared options in this process (plugins loaded), under its section path.
std::string recipe_reference();

}  // namespace mllm
