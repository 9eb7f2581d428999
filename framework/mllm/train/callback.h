// Training callbacks: plugins that watch the loop (progress bar, metrics, eval, samples,
// checkpoints). Chosen by name in the recipe's `callbacks:` list and run on every rank (a
// callback that does collective work — eval, checkpoint — relies on that), ordered by phase
// (CallbackPhase), in recipe order within a phase.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"

namespace mllm {

class Trainer;

// What one optimizer step did. Times are milliseconds on this rank; loss is the global mean
// over real target tokens (identical on all ranks).
struct StepMetrics {
  int64_t step = 0;            // optimizer steps completed (1-based after the first step)
  int64_t tokens = 0;          // tokens processed so far, all ranks (input positions)
  int64_t target_tokens = 0;   // real (non-PAD) target tokens in this step's global batch
  double loss = 0;             // nats per target token
  double lr = 0;
  double grad_norm = 0;        // global L2 norm before clipping
  double tokens_per_s = 0;     // all ranks, this step
  double mfu = 0;              // model FLOPs utilisation, 0..1 (see Trainer::peak_flops)
  double forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0, step_ms = 0;
  bool skipped = false;        // non-finite loss or grad norm: no update (train.on_nonfinite=skip)
  int64_t nonfinite_skips = 0; // skipped updates so far in the run
  // data.sources: (source name, tokens drawn from it so far, all ranks); empty otherwise.
  std::vector<std::pair<std::string, int64_t>> source_tokens;
};

// Result of one evaluation (Trainer::evaluate): mean loss over every real target token of the
// eval.batches val batches, split across ranks, the same on every rank.
struct EvalMetrics {
  int64_t step = 0;      // optimizer steps completed when it ran
  double val_loss = 0;   // nats per target token
  double val_ppl = 0;    // exp(val_loss)
  int64_t tokens = 0;    // target tokens evaluated, all ranks
};

// When a callback runs among the others after each step and at the end of the run:
// kBeforeSave (metrics, eval: a non-finite val loss stops the run before it is saved), then
// kSave (checkpoint), then kAfterSave (samples, progress; the default) — so an error in
// sampling or in a plugin never costs the steps since the last checkpoint.
enum class CallbackPhase { kBeforeSave = 0, kSave = 1, kAfterSave = 2 };

// Why the loop ended.
enum class StopReason { kMaxSteps, kStopAtStep, kTimeLimit, kSignal };
const char* to_string(StopReason r);

// The hooks, called on every rank in phase order (docs/extending.md: when each runs, what a
// callback may call). A hook that throws ends the run with that error (mllm-train exits 1, or
// 2 for bad input); the checkpoints already saved stay.
class Callback {
 public:
  virtual ~Callback() = default;
  // Once, after the Trainer is built and resumed (t.step() is the resumed step, 0 if fresh),
  // before the first step.
  virtual void on_train_begin(Trainer&) {}
  // After the optimizer's update of `step` (not for a skipped one), before ZeRO stages 1-3
  // start their parameter all-gathers for the next step's forward (DataParallel::
  // all_gather_params): the first work of step + 1 that is not in step + 1's own range.
  virtual void on_optimizer_step_end(Trainer&, int64_t /*step*/) {}
  // After every optimizer step (a skipped update too: m.skipped), with that step's metrics.
  virtual void on_step_end(Trainer&, const StepMetrics&) {}
  // After each evaluation with a finite val loss (the eval callback's, every eval.every_steps
  // and at the end; any Trainer::evaluate() call), before the eval callback logs it. Must not
  // call Trainer::evaluate() itself.
  virtual void on_eval_end(Trainer&, const EvalMetrics&) {}
  // Once, when the loop ends (why: StopReason), before the process exits; not after an error.
  virtual void on_train_end(Trainer&, StopReason) {}
  virtual CallbackPhase phase() const { return CallbackPhase::kAfterSave; }
};

// Factory: (recipe) -> callback.
using CallbackRegistry = Registry<Callback, const Recipe&>;
CallbackRegistry& callback_registry();

// Registers progress, metrics, eval, samples, checkpoint.
void register_builtin_callbacks();

}  // namespace mllm
