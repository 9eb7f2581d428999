// mllm-generate --checkpoint DIR --prompt TEXT: continues a prompt with a trained model,
// streaming the text to stdout as it is generated.
#include <iostream>
#include <random>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/blas.h"
#include "mllm/core/plugin.h"
#include "mllm/core/recipe.h"
#include "mllm/data/tokenizer.h"
#include "mllm/model/generate.h"
#include "mllm/model/model.h"
#include "mllm/train/app.h"
#include "mllm/train/builtins.h"
#include "mllm/train/checkpoint.h"

int main(int argc, char** argv) {
  // Before anything else (MPI, threads): may re-execute this program once with a faster BLAS.
  mllm::ensure_fast_blas(argv);
  CLI::App app{"mllm-generate: continue a prompt with a model from an mllm checkpoint.\n"
               "Exit codes: 0 done, 2 bad input (checkpoint, options), 1 anything else.",
               "mllm-generate"};
  std::string checkpoint, prompt;
  mllm::GenerateOptions opt;
  opt.top_k = 50;
  int64_t threads = 0;
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint folder (checkpoints/step_NNNNNN), its checkpoints/latest file, or "
                 "a run folder / checkpoints folder (uses `latest`)")->required();
  app.add_option("--prompt", prompt, "text to continue")->required();
  app.add_option("--max-new-tokens", opt.max_new_tokens, "tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--temperature", opt.temperature, "softmax temperature; 0 = greedy")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", opt.top_k, "keep the k most likely tokens; 0 = off")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", opt.top_p, "nucleus sampling mass in (0, 1]; 1 = off")->capture_default_str();
  auto* seed_opt = app.add_option("--seed", opt.seed,
                                  "sampling seed (default: a new one per call, printed to stderr)");
  app.add_option("--threads", threads, "intra-op threads; 0 = all cores")->capture_default_str()->check(CLI::NonNegativeNumber);
  std::vector<std::string> plugins;
  auto* plugins_opt = app.add_option(
      "--plugins", plugins,
      "plugin libraries to load instead of the checkpoint recipe's `plugins:` (e.g. when they "
      "moved since training; paths relative to the working directory)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help or the usage error
    return rc == 0 ? 0 : 2;      // a bad command line is bad input
  }

  return mllm::run_guarded("mllm-generate", [&] {
    mllm::check_generate_options(opt);  // before anything is printed
    mllm::register_builtins();
    const auto [folder, recipe] = mllm::open_checkpoint(
        checkpoint, plugins_opt->count() ? std::optional(plugins) : std::nullopt);
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    if (mllm::blas_startup_note().warn) spdlog::warn("{}", mllm::describe_blas());
    else spdlog::info("{}", mllm::describe_blas());
    auto tokenizer = mllm::load_tokenizer(mllm::checkpoint_tokenizer_path(folder));
    auto model = mllm::model_registry().create(recipe.model.type, recipe.model,
                                               tokenizer->vocab_size(), recipe.max_seq_len());
    mllm::load_model_weights(folder, *model);
    model->eval();
    torch::NoGradGuard no_grad;

    std::vector<int64_t> ids{mllm::kBosId};
    int64_t unknown = 0;
    for (int32_t id : tokenizer->encode(prompt)) {
      ids.push_back(id);
      unknown += id == mllm::kUnkId;
    }
    // The notes go to stderr: stdout holds the text alone.
    if (unknown > 0)
      std::cerr << "mllm-generate: warning: " << unknown << " token(s) of the prompt are not in the "
                << "checkpoint's vocabulary and became <UNK>; the model continues from that\n";
    if (!seed_opt->count() && opt.temperature > 0) {
      opt.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
      std::cerr << "mllm-generate: seed " << opt.seed << " (--seed " << opt.seed
                << " repeats this text)\n";
    }
    opt.eos_id = mllm::kEosId;
    mllm::IncrementalDecoder decoder(tokenizer);
    std::cout << prompt << std::flush;
    int64_t generated = 0;
    mllm::generate(*model, ids, opt, [&](int64_t id) {
      ++generated;
      std::cout << decoder.push(static_cast<int32_t>(id)) << std::flush;
    });
    std::cout << decoder.flush() << std::endl;
    if (generated < opt.max_new_tokens)
      std::cerr << "mllm-generate: stopped at end-of-text after " << generated << " of "
                << opt.max_new_tokens << " new token(s) (the model ended the document)\n";
    return 0;
  });
}
