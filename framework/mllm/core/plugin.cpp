// dlopen-based plugin loading.
#include "mllm/core/plugin.h"

#include <dlfcn.h>

#include <filesystem>
#include <set>

#include "mllm/core/error.h"

namespace mllm {

void load_plugins(const std::vector<std::string>& paths) {
  static std::set<std::string> loaded;
  for (const auto& path : paths) {
    std::error_code ec;
    std::string canon = std::filesystem::weakly_canonical(path, ec).string();
    if (loaded.count(canon)) continue;
    if (!std::filesystem::exists(path))
      throw ConfigError("plugin '" + path + "': no such file (plugins: paths are relative to the "
                        "working directory)");
    // A path without '/' would make dlopen search the library path instead of the file.
    std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
    void* handle = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw ConfigError("plugin '" + path + "' failed to load: " + dlerror());
    dlerror();
    void* sym = dlsym(handle, kPluginEntryPoint);
    if (!sym) {
      dlclose(handle);
      throw ConfigError("plugin '" + path + "' has no entry point `extern \"C\" void " +
                        kPluginEntryPoint + "()`; export it and register components there");
    }
    auto entry = reinterpret_cast<void (*)()>(sym);
    try {
      entry();
    } catch (const Error& e) {
      throw ConfigError("plugin '" + path + "': " + kPluginEntryPoint + "() failed: " + e.what());
    }
    loaded.insert(canon);
  }
}

}  // namespace mllm
