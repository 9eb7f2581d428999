// mllm-export --checkpoint DIR --out DIR [--dtype fp32|bf16]: a llama checkpoint as a Hugging
// Face LlamaForCausalLM folder (config.json, model.safetensors, generation_config.json,
// tokenizer files), loadable with transformers' AutoModelForCausalLM.from_pretrained(DIR).
#include <iostream>

#include <CLI/CLI.hpp>

#include "mllm/train/app.h"
#include "mllm/train/builtins.h"
#include "mllm/train/hf_export.h"

int main(int argc, char** argv) {
  CLI::App app{
      "mllm-export: write a llama checkpoint as a Hugging Face LlamaForCausalLM folder.\n"
      "minillm checkpoints have no standard equivalent: their model.safetensors (mllm names) is\n"
      "the export. Exit codes: 0 done, 2 bad input (checkpoint, options), 1 anything else.",
      "mllm-export"};
  std::string checkpoint, out, dtype = "fp32";
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint folder (checkpoints/step_NNNNNN), its checkpoints/latest file, or a "
                 "run folder / checkpoints folder (uses `latest`)")->required();
  app.add_option("--out", out, "folder to write (created)")->required();
  app.add_option("--dtype", dtype, "weights dtype: fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return mllm::run_guarded("mllm-export", [&] {
    mllm::register_builtins();
    for (const auto& f : mllm::export_hf(checkpoint, out, dtype)) std::cout << f << "\n";
    return 0;
  });
}
