// register_builtins(): every area's built-in registrations, once.
#include "mllm/train/builtins.h"

#include <mutex>

#include "mllm/data/tokenizer.h"
#include "mllm/model/model.h"
#include "mllm/optim/lr_schedule.h"
#include "mllm/optim/optimizer.h"
#include "mllm/train/callback.h"

namespace mllm {

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_builtin_tokenizers();
    register_builtin_models();
    register_builtin_optimizers();
    register_builtin_lr_schedules();
    register_builtin_callbacks();
  });
}

}  // namespace mllm
