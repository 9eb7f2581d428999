// Plugins: shared libraries listed under `plugins:` in a recipe. Each one
//   - carries the build stamp MLLM_PLUGIN_STAMP() (in exactly one of its .cpp files), which
//     records the mllm version, plugin ABI, LibTorch version and C++ ABI it was compiled against;
//   - exports `extern "C" void mllm_register_plugin()`, which registers its components into the
//     registries (model_registry() etc.) by name, and declares their options (options.h).
// docs/plugins.md walks through an out-of-tree plugin built with find_package(mllm).
#pragma once

#include <string>
#include <vector>

#include "mllm/version.h"

#define MLLM_STRINGIFY_IMPL(x) #x
#define MLLM_STRINGIFY(x) MLLM_STRINGIFY_IMPL(x)

// The stamp text: ';'-separated key=value pairs, compared field by field when loading.
#define MLLM_PLUGIN_STAMP_TEXT                                                         \
  "mllm_version=" MLLM_VERSION_STRING ";plugin_abi=" MLLM_STRINGIFY(MLLM_PLUGIN_ABI)   \
  ";torch=" MLLM_TORCH_VERSION_STRING ";cxx11_abi=" MLLM_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)

// Puts the stamp into the plugin's ELF section `.mllm_plugin_stamp`. The loader reads it from the
// file before dlopen, so a plugin built against another mllm is refused before any of its code
// (static initialisers included) runs in this process.
#define MLLM_PLUGIN_STAMP()                                                               \
  extern "C" __attribute__((used, section(".mllm_plugin_stamp"), visibility("default")))  \
  const char mllm_plugin_stamp[] = MLLM_PLUGIN_STAMP_TEXT

namespace mllm {

// The symbol every plugin exports.
inline constexpr const char* kPluginEntryPoint = "mllm_register_plugin";
// The ELF section holding a plugin's build stamp.
inline constexpr const char* kPluginStampSection = ".mllm_plugin_stamp";

// This libmllm's own stamp (MLLM_PLUGIN_STAMP_TEXT as compiled into it).
const char* plugin_stamp();

// The stamp text in the ELF file at `path`, "" when the file has no stamp section. Throws
// ConfigError when the file cannot be read or is not a 64-bit ELF file.
std::string read_plugin_stamp(const std::string& path);

// Checks each library's stamp against plugin_stamp(), then dlopens it (RTLD_NOW) and calls its
// entry point once; a library already loaded by this process is skipped. Throws ConfigError
// naming the library and the reason: no such file, no stamp, a stamp of another mllm version,
// plugin ABI, LibTorch version or C++ ABI (both named), not a regular file, the dlerror text, a
// missing entry point, or anything the entry point throws (e.g. a duplicate name).
void load_plugins(const std::vector<std::string>& paths);

// Where libmllm looks for a module of its own that it dlopen()s (libmllm_spm.so,
// libmllm_parquet.so): $`env_var` when set and not empty, else `file_name` in the folder of
// libmllm.so (build tree or install), else `file_name` alone (the loader's search path).
std::string libmllm_module_path(const char* env_var, const char* file_name);

}  // namespace mllm
