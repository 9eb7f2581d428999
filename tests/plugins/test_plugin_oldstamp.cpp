// A plugin stamped by an older mllm (0.0.9): refused before dlopen, naming both versions. Its
// static initialiser and entry point would abort, so running any of its code fails the test.
#include <cstdlib>

#include "mllm/version.h"

extern "C" __attribute__((used, section(".mllm_plugin_stamp"), visibility("default")))
const char mllm_plugin_stamp[] = "mllm_version=0.0.9;plugin_abi=1;torch=" MLLM_TORCH_VERSION_STRING
                                 ";cxx11_abi=1";

namespace {
struct AbortOnLoad {
  AbortOnLoad() { std::abort(); }
} abort_on_load;
}  // namespace

extern "C" void mllm_register_plugin() { std::abort(); }
