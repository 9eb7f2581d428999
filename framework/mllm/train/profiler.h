// profile.steps: [FIRST, LAST] records those optimizer steps with LibTorch's profiler (Kineto:
// CPU ops, and CUDA kernels and runtime calls on a GPU) plus mllm's named ranges (core/trace.h)
// and writes RUN/profile/rank_NN.json on every rank, a Chrome trace (the JSON object format of
// the Trace Event Format) that Perfetto (ui.perfetto.dev) and chrome://tracing open.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/core/trace.h"
#include "mllm/train/callback.h"

namespace mllm {

// The callback the trainer adds when profile.steps is set: starts recording after step FIRST - 1
// (or at the start, when a resumed run is already past it), stops after step LAST or at the end
// of the run, whichever comes first, and writes the trace. A run that never reaches FIRST writes
// nothing. Throws mllm::Error naming the file when the trace cannot be written.
std::shared_ptr<Callback> make_profiler_callback(const Recipe& recipe);

// Merges `ranges` into the Chrome trace JSON `kineto_trace` (as ProfilerResult::save writes it:
// "ts" in microseconds since its "baseTimeNanoseconds") as complete ("X") events of category
// "mllm" on process `pid`, and names "mllm communication" the threads Kineto recorded nothing
// on. Returns the JSON text. Throws mllm::Error when `kineto_trace` is not such a JSON object.
std::string merge_trace_ranges(const std::string& kineto_trace,
                               const std::vector<trace::Range>& ranges, int64_t pid);

}  // namespace mllm
