// mllm-prepare RECIPE [key.path=value ...]: tokenizer + train/val token shards for a recipe's
// data section, written into data.cache_dir/<data fingerprint>/ (see docs/data.md); under
// mpirun every rank prepares a share. Exit 0 done, 2 bad input, 1 other.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <thread>

#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/core/recipe.h"
#include "mllm/data/prepare.h"
#include "mllm/data/tokenizer.h"
#include "mllm/distributed/communicator.h"
#include "mllm/distributed/prepare_group.h"
#include "mllm/core/plugin.h"
#include "mllm/train/app.h"
#include "mllm/train/builtins.h"

int main(int argc, char** argv) {
  CLI::App app{
      "mllm-prepare: tokenize a recipe's corpus (.txt / .jsonl, also .gz / .zst, .parquet) into\n"
      "token shards: tokenizer.mllm, train-NNNNN.bin, val-NNNNN.bin, manifest.json in\n"
      "data.cache_dir/<data fingerprint>/, in memory bounded by data.prepare_memory_mb.\n"
      "Under mpirun every rank prepares a share, and the output is the same at any number of\n"
      "ranks: mpirun -np 4 mllm-prepare RECIPE. A re-run continues an interrupted one.\n"
      "Exit codes: 0 done (or the cache was up to date), 2 bad input (recipe, corpus: the\n"
      "message names the file and line), 1 anything else.",
      "mllm-prepare"};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int threads = 0;
  bool force = false;
  app.add_option("recipe", recipe_path, "recipe YAML file, or the name of a bundled one (mini)")
      ->required();
  app.add_option("overrides", overrides, "key.path=value overrides, e.g. data.seq_len=128");
  app.add_option("-j,--threads", threads,
                 "worker threads per rank (0 = this node's cores shared by its ranks)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("-f,--force", force, "rebuild even when the cache is up to date");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? 0 : 2;      // a bad command line is bad input
  }

  int rank = 0;
  try {
    const auto [launch_rank, launch_size] = mllm::launcher_rank_and_size();
    rank = launch_rank;
    mllm::init_logging(rank, launch_size, mllm::resolve_log_level("info"));
    const mllm::Recipe recipe = mllm::load_recipe(mllm::resolve_recipe_path(recipe_path), overrides);
    mllm::init_logging(rank, launch_size, mllm::resolve_log_level(recipe.log.level));
    mllm::register_builtins();
    mllm::load_plugins(recipe.plugins);  // a plugin may provide the tokenizer
    // Under mpirun every rank prepares a share of the corpus (docs/data.md).
    const auto group = mllm::make_prepare_group();
    rank = group->rank();
    const auto& data = recipe.data;
    if (threads == 0) {
      // The cores of this node, shared by its ranks.
      const int local = std::max(1, mllm::launcher_local_size());
      threads = std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) / local);
    }
    mllm::PrepareStats st;
    bool prepared = false;
    const auto p = mllm::ensure_prepared(data, threads, /*show_progress=*/true, *group, force,
                                         &prepared, &st);
    if (!prepared) {
      spdlog::info("data cache '{}' is up to date ({} train shard(s), {} val shard(s)); use "
                   "--force to rebuild",
                   p.dir, p.train_shards.size(), p.val_shards.size());
      mllm::flush_logs();
      return 0;
    }
    spdlog::info("wrote {}: tokenizer ({} ids), train {} documents / {} tokens in {} shard(s), "
                 "val {} documents / {} tokens in {} shard(s)",
                 p.dir, st.vocab_size, st.train_documents, st.train_tokens, st.train_shards,
                 st.val_documents, st.val_tokens, st.val_shards);
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: peak resident set, KiB on Linux
    std::string rss_per_rank;
    for (const auto& v : group->all_gather(std::to_string(usage.ru_maxrss / 1024)))
      rss_per_rank += (rss_per_rank.empty() ? "" : ", ") + v;
    spdlog::info("prepared {:.1f} MB of corpus into {} tokens in {:.2f} s ({:.1f} MB/s of corpus "
                 "on disk; tokenizer pass {:.2f} s, encode pass {:.2f} s ({:.1f} MB of text), "
                 "shards {:.2f} s; {} rank(s) x {} thread(s); {} of {} segment(s) reused; peak RSS "
                 "per rank {} MiB)",
                 double(st.corpus_bytes) / 1e6, st.train_tokens + st.val_tokens, st.seconds,
                 double(st.corpus_bytes) / 1e6 / std::max(1e-9, st.seconds), st.tokenizer_seconds,
                 st.encode_seconds, double(st.text_bytes) / 1e6, st.assemble_seconds, st.ranks,
                 threads, st.segments_reused, st.segments, rss_per_rank);
    mllm::flush_logs();
    return 0;
  } catch (const mllm::Error& e) {
    // Preparation's errors reach every rank alike (prepare.h): rank 0 says it.
    if (rank == 0) spdlog::error("{}", e.what());
    mllm::flush_logs();
    return e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    mllm::flush_logs();
    return 1;
  }
}
