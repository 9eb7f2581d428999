// Out-of-line part of the error family: the failure path of MLLM_CHECK.
#include "mllm/core/error.h"

#include <atomic>

namespace mllm {
namespace {
std::atomic<int64_t> g_current_step{0};
}  // namespace

void set_current_step(int64_t step) { g_current_step.store(step); }
int64_t current_step() { return g_current_step.load(); }

}  // namespace mllm

namespace mllm::detail {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": check `" + expr +
              "` failed: " + msg);
}

}  // namespace mllm::detail
