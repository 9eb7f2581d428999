// mllm-train RECIPE [key.path=value ...]: trains the model a recipe describes, on one process
// or under mpirun with one rank per process.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "mllm/core/blas.h"
#include "mllm/core/recipe.h"
#include "mllm/distributed/communicator.h"
#include "mllm/train/device.h"
#include "mllm/train/app.h"
#include "mllm/train/builtins.h"
#include "mllm/train/trainer.h"

int main(int argc, char** argv) {
  // First thing: a stop signal at any moment from here on ends the run cleanly (after its
  // first step, with a checkpoint), never kills it half-built.
  mllm::install_stop_signal_handlers();
  // Before anything else (MPI, threads): may re-execute this program once with a faster BLAS.
  mllm::ensure_fast_blas(argv);
  CLI::App app{
      "mllm-train: train a decoder-only language model from a YAML recipe.\n"
      "Run under mpirun for data parallelism: mpirun -np 8 mllm-train recipes/mini.yaml\n"
      "(in a new shell, `source launch/env.sh` first: PATH, OpenMPI settings, Ctrl-C = clean stop).\n"
      "SIGUSR1/SIGTERM/SIGINT: a checkpoint at the end of the step, exit 0 (under mpirun: SIGUSR1).\n"
      "Exit codes: 0 done (also after a checkpointed early stop), 2 bad input (recipe, corpus,\n"
      "checkpoint), 1 anything else.",
      "mllm-train"};
  std::string recipe_path;
  std::vector<std::string> overrides;
  bool print_recipe = false, help_recipe = false;
  app.add_option("recipe", recipe_path,
                 "recipe YAML file, or the name of a bundled one (mini: <prefix>/share/mllm/recipes/mini.yaml)");
  app.add_option("overrides", overrides, "key.path=value overrides, e.g. optim.lr=3e-4 train.max_steps=100");
  app.add_flag("--print-recipe", print_recipe, "print the resolved recipe (defaults, includes, overrides applied) and exit");
  app.add_flag("--help-recipe", help_recipe,
               "print every recipe key with type, default and meaning, and exit; with a recipe, also "
               "the options its plugins' components declare");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help or the usage error
    return rc == 0 ? 0 : 2;      // a bad command line is bad input
  }

  return mllm::run_guarded("mllm-train", [&] {
    if (help_recipe && recipe_path.empty()) {
      std::cout << mllm::recipe_reference();
      return 0;
    }
    if (recipe_path.empty()) throw mllm::ConfigError("no recipe given; usage: mllm-train RECIPE [key.path=value ...]");
    mllm::Recipe recipe = mllm::load_recipe(mllm::resolve_recipe_path(recipe_path), overrides);
    if (help_recipe) {  // the recipe's plugins are loaded now: their options are listed too
      std::cout << mllm::recipe_reference();
      return 0;
    }
    mllm::register_builtins();  // the recipe's plugins are loaded: every name can be checked
    mllm::check_component_names(recipe, overrides);
    if (print_recipe) {
      std::cout << mllm::to_yaml(recipe);
      return 0;
    }
    // Checked before MPI starts, from the launcher's world size: every rank fails the same
    // way, prints nothing twice, and no rank needs MPI_Abort.
    const int launcher_world = mllm::launcher_rank_and_size().second;
    mllm::validate_for_world(recipe, launcher_world);
    if (recipe.dist.backend == "single" && launcher_world > 1)
      throw mllm::ConfigError(recipe.source + ": dist.backend=single but the launcher started " +
                              std::to_string(launcher_world) + " ranks; they would train " +
                              "independently into one run folder. Use dist.backend=auto or mpi, "
                              "or start one process");
    // Before the communicator: dist.backend auto picks nccl for a CUDA model.
    const auto device_type = mllm::resolve_device_type(recipe.train.device, recipe.source);
    auto comm = mllm::make_communicator(recipe.dist, device_type == torch::kCUDA);
    // Declared outside the try: an error is logged and the job aborted while the trainer and the
    // communicator still exist, since their destructors (waits for buckets in flight, NCCL's
    // teardown) could block on peers that never come.
    std::unique_ptr<mllm::Trainer> trainer;
    try {
      trainer = std::make_unique<mllm::Trainer>(recipe, comm);
      trainer->run();
    } catch (...) {
      return mllm::report_error("mllm-train");
    }
    return 0;
  });
}
