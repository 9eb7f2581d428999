// mllm-eval --checkpoint DIR --corpus FILE...: loss, perplexity and bits per character of a
// checkpoint on any .txt / .jsonl text, with the checkpoint's own tokenizer; one process or
// under mpirun (the sequences are split across the ranks; the same figures at any rank count).
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/blas.h"
#include "mllm/core/logging.h"
#include "mllm/core/plugin.h"
#include "mllm/core/recipe.h"
#include "mllm/data/corpus.h"
#include "mllm/data/tokenizer.h"
#include "mllm/distributed/communicator.h"
#include "mllm/model/model.h"
#include "mllm/train/app.h"
#include "mllm/train/builtins.h"
#include "mllm/train/checkpoint.h"
#include "mllm/train/corpus_eval.h"
#include "mllm/train/device.h"
#include "mllm/train/trainer.h"

int main(int argc, char** argv) {
  mllm::ensure_fast_blas(argv);  // before MPI and threads (core/blas.h)
  CLI::App app{
      "mllm-eval: loss, perplexity and bits per character of a checkpoint on any text.\n"
      "Run under mpirun to split the sequences across ranks: the figures agree to float\n"
      "rounding (about 1e-10 relative).\n"
      "Exit codes: 0 done, 2 bad input (checkpoint, corpus, options), 1 anything else.",
      "mllm-eval"};
  std::string checkpoint, text_field, device_setting = "auto";
  std::vector<std::string> corpus;
  int64_t batch = 0, seq_len = 0, threads = 0;
  bool as_json = false;
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint folder (checkpoints/step_NNNNNN), its checkpoints/latest file, or a "
                 "run folder / checkpoints folder (uses `latest`)")->required();
  app.add_option("--corpus", corpus, ".txt or .jsonl files or globs to evaluate")->required();
  app.add_option("--text-field", text_field, ".jsonl field holding the text (default: the checkpoint's data.text_field)");
  std::string invalid_utf8;
  app.add_option("--invalid-utf8", invalid_utf8, "error or replace (with U+FFFD) for invalid UTF-8 in the corpus (default: the checkpoint's data.invalid_utf8)")
      ->check(CLI::IsMember({"error", "replace"}));
  app.add_option("--seq-len", seq_len, "tokens of context per window (default: the checkpoint's data.seq_len)")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "windows per forward pass (default: the checkpoint's train.micro_batch)")->check(CLI::PositiveNumber);
  app.add_option("--device", device_setting, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads per rank; 0 = usable CPUs / ranks on this node")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--json", as_json, "print the result as one JSON object");
  std::vector<std::string> plugins;
  auto* plugins_opt = app.add_option(
      "--plugins", plugins,
      "plugin libraries to load instead of the checkpoint recipe's `plugins:` (e.g. when they "
      "moved since training; paths relative to the working directory)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  return mllm::run_guarded("mllm-eval", [&] {
    mllm::register_builtins();
    const auto [folder, recipe] = mllm::open_checkpoint(
        checkpoint, plugins_opt->count() ? std::optional(plugins) : std::nullopt);
    mllm::DataConfig data = recipe.data;
    data.corpus = corpus;
    if (!text_field.empty()) data.text_field = text_field;
    if (!invalid_utf8.empty()) data.invalid_utf8 = invalid_utf8;
    // Errors about the corpus name this program's options, not the recipe keys.
    data.corpus_option = "--corpus";
    data.invalid_utf8_fix = "pass --invalid-utf8 replace";
    const int64_t window = seq_len > 0 ? seq_len : data.seq_len;
    const int64_t rows = batch > 0 ? batch : recipe.train.micro_batch;

    mllm::DistConfig dist = recipe.dist;
    dist.backend = "auto";  // (the all-reduce is of one CPU tensor: MPI under mpirun, else none)
    auto comm = mllm::make_communicator(dist, /*want_cuda=*/false);
    mllm::init_logging(comm->rank(), comm->world_size(), mllm::resolve_log_level(recipe.log.level));
    torch::set_num_threads(mllm::resolve_threads(threads, comm->local_size()));
    const torch::Device device = mllm::rank_device(
        mllm::resolve_device_type(device_setting, "--device"), comm->local_rank());
    if (mllm::blas_startup_note().warn) spdlog::warn("{}", mllm::describe_blas());

    auto tokenizer = mllm::load_tokenizer(mllm::checkpoint_tokenizer_path(folder));
    auto model = mllm::model_registry().create(recipe.model.type, recipe.model,
                                               tokenizer->vocab_size(), recipe.max_seq_len());
    mllm::load_model_weights(folder, *model);
    model->to(device);
    if (window > model->max_seq_len())
      throw mllm::ConfigError(fmt::format("--seq-len {} exceeds the model's max_seq_len {}", window,
                                          model->max_seq_len()));
    const auto documents = mllm::read_corpus(data);
    const mllm::CorpusEvalResult r =
        mllm::evaluate_corpus(*model, *tokenizer, documents, window, rows, *comm, device);
    if (comm->rank() == 0) {
      if (as_json) {
        std::cout << nlohmann::json({{"checkpoint", folder}, {"loss", r.loss},
                                     {"perplexity", r.perplexity},
                                     {"bits_per_char", r.bits_per_char}, {"tokens", r.tokens},
                                     {"characters", r.characters}, {"documents", r.documents},
                                     {"sequences", r.sequences}, {"seq_len", window}})
                         .dump()
                  << std::endl;
      } else {
        std::cout << fmt::format(
                         "{}: loss {:.4f} | perplexity {:.2f} | bits per character {:.4f} | {} "
                         "tokens, {} characters, {} documents, {} window(s) of {} tokens, {} rank(s)",
                         folder, r.loss, r.perplexity, r.bits_per_char, r.tokens, r.characters,
                         r.documents, r.sequences, window, comm->world_size())
                  << std::endl;
      }
    }
    return 0;
  });
}
