// Fault injection for the reliability tests (docs/reliability.md): one environment variable,
// MLLM_FAULT, read once per process. Unset (the normal case) costs one pointer test per query.
//
//   MLLM_FAULT="KIND:key=value:key=value[,KIND:...]"
//
//   throw:rank=R:step=N              rank R throws mllm::Error in step N (before its update)
//   sleep:rank=R:step=N:seconds=S    rank R sleeps S seconds in step N (a straggler or hang)
//   nan:rank=R:step=N                rank R's loss (hence its gradients) is NaN in step N
//   desync:rank=R:step=N             rank R perturbs one parameter after step N (replicas
//                                    drift apart, for dist.check_every_steps)
//   enospc:step=N[:file=NAME]        the checkpoint of step N fails to write NAME (default
//                                    model.pt) with ENOSPC, as on a full disk
//   kill:step=N                      SIGKILL while writing the checkpoint of step N (after
//                                    model.pt), as a node failure would
//   skew:step=N:by=X                 the loss reported for step N (log, metrics.jsonl) is off by
//                                    X; the update is untouched (a wrong number for the tools
//                                    that compare runs, launch/gpu-check.sh, to catch)
//   prepare_throw:segment=S          data preparation throws mllm::Error when it starts encoding
//                                    segment S (corpus.h), on whichever rank has it
//   prepare_kill:segment=S           SIGKILL once segment S's pieces are written, as a node
//                                    failure during preparation would
//
// rank defaults to 0 where it applies. A malformed value throws ConfigError naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mllm {

struct Fault {
  std::string kind;       // throw | sleep | nan | desync | enospc | kill | skew | prepare_*
  int rank = 0;
  int64_t step = -1;      // the step being taken (1-based), the step being checkpointed, or the
                          // segment (prepare_*; key segment=)
  double seconds = 0;     // sleep
  double by = 0;          // skew
  std::string file = "model.pt";  // enospc
};

// Parses a MLLM_FAULT value. Throws ConfigError("MLLM_FAULT: ...") on an unknown kind or key,
// a non-number, or a missing step.
std::vector<Fault> parse_faults(const std::string& spec);

// The fault of `kind` injected for (rank, step) by this process's MLLM_FAULT, if any. For
// kinds without a rank (enospc, kill, skew, prepare_*) pass rank = -1. Throws ConfigError when MLLM_FAULT is
// malformed (first query).
std::optional<Fault> injected_fault(const std::string& kind, int rank, int64_t step);

}  // namespace mllm
