// Out-of-line part of the error family: the failure path of MLLM_CHECK.
#include "mllm/core/error.h"

namespace mllm::detail {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": check `" + expr +
              "` failed: " + msg);
}

}  // namespace mllm::detail
