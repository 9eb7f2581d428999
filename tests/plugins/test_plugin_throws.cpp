// A stamped plugin whose entry point throws a std::exception that is not an mllm::Error: the load
// fails with exit-2 bad input naming the plugin, never an unexpected error or an abort.
#include <stdexcept>

#include "mllm/core/plugin.h"

MLLM_PLUGIN_STAMP();

extern "C" void mllm_register_plugin() { throw std::runtime_error("boom from the plugin"); }
