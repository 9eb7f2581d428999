// One place that registers every built-in component (STYLE.md: static registrars get dropped
// from libraries, so registration is explicit).
#pragma once

namespace mllm {

// Registers built-in tokenizers, models, optimizers, lr schedules and callbacks
// (communicators register themselves in make_communicator). Idempotent.
void register_builtins();

}  // namespace mllm
