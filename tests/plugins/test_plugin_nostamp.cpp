// A plugin without MLLM_PLUGIN_STAMP(): refused before dlopen (its entry point would abort).
#include <cstdlib>

extern "C" void mllm_register_plugin() { std::abort(); }
