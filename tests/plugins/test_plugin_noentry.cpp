// A shared library with a valid build stamp but without the mllm_register_plugin entry point:
// loading it must fail clearly.
#include "mllm/core/plugin.h"

MLLM_PLUGIN_STAMP();

extern "C" int mllm_not_a_plugin() { return 1; }
