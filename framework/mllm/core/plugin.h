// Plugins: shared libraries listed under `plugins:` in a recipe. Each exports
//   extern "C" void mllm_register_plugin();
// which registers its components into the registries (model_registry() etc.) by name.
#pragma once

#include <string>
#include <vector>

namespace mllm {

// The symbol every plugin exports.
inline constexpr const char* kPluginEntryPoint = "mllm_register_plugin";

// dlopens each library (RTLD_NOW) and calls its entry point once; a library already loaded by
// this process is skipped. Throws ConfigError naming the library and the reason (dlerror text,
// missing entry point) or whatever the entry point throws (e.g. a duplicate name).
void load_plugins(const std::vector<std::string>& paths);

}  // namespace mllm
