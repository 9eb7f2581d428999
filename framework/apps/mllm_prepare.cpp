// mllm-prepare RECIPE [key.path=value ...]: tokenizer + train/val token shards for a recipe's
// data section, written into data.cache_dir (see docs/data.md). Exit 0 done, 2 bad input, 1 other.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <thread>

#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/core/recipe.h"
#include "mllm/data/prepare.h"
#include "mllm/data/tokenizer.h"
#include "mllm/core/plugin.h"
#include "mllm/train/app.h"
#include "mllm/train/builtins.h"

int main(int argc, char** argv) {
  CLI::App app{"mllm-prepare: tokenize a recipe's corpus into token shards (tokenizer, "
               "train.bin, val.bin in data.cache_dir)"};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int threads = 0;
  bool force = false;
  app.add_option("recipe", recipe_path, "recipe YAML file, or the name of a bundled one (mini)")
      ->required();
  app.add_option("overrides", overrides, "key.path=value overrides, e.g. data.seq_len=128");
  app.add_option("-j,--threads", threads, "encoding threads (0 = every core)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("-f,--force", force, "rebuild even when the cache is up to date");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? 0 : 2;      // a bad command line is bad input
  }

  try {
    mllm::init_logging(0, 1, mllm::resolve_log_level("info"));
    const mllm::Recipe recipe = mllm::load_recipe(mllm::resolve_recipe_path(recipe_path), overrides);
    mllm::init_logging(0, 1, mllm::resolve_log_level(recipe.log.level));
    mllm::register_builtins();
    mllm::load_plugins(recipe.plugins);  // a plugin may provide the tokenizer
    const auto& data = recipe.data;
    if (!force && mllm::is_prepared(data)) {
      const auto p = mllm::prepared_paths(data);
      spdlog::info("data cache '{}' is up to date ({}, {}, {}); use --force to rebuild",
                   data.cache_dir, p.tokenizer_path, p.train_shard, p.val_shard);
      return 0;
    }
    if (threads == 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    mllm::PrepareStats st;
    const auto p = mllm::prepare_data(data, threads, /*show_progress=*/true, &st);
    spdlog::info("wrote {} ({} ids), {} ({} documents, {} tokens), {} ({} documents, {} tokens)",
                 p.tokenizer_path, st.vocab_size, p.train_shard, st.train_documents,
                 st.train_tokens, p.val_shard, st.val_documents, st.val_tokens);
    spdlog::info("prepared {:.1f} MB of corpus into {} tokens in {:.2f} s ({:.1f} MB/s, {} "
                 "threads)",
                 double(st.corpus_bytes) / 1e6, st.train_tokens + st.val_tokens, st.seconds,
                 double(st.corpus_bytes) / 1e6 / std::max(1e-9, st.seconds), threads);
    mllm::flush_logs();
    return 0;
  } catch (const mllm::Error& e) {
    spdlog::error("{}", e.what());
    mllm::flush_logs();
    return e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    mllm::flush_logs();
    return 1;
  }
}
