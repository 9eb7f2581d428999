// One place that registers every built-in component (STYLE.md: static registrars get dropped
// from libraries, so registration is explicit).
#pragma once

namespace mllm {

// Registers built-in tokenizers, models, optimizers, lr schedules, communicators and
// callbacks. Idempotent: a second call does nothing.
void register_builtins();

}  // namespace mllm
