// Plugin loading: the build-stamp check (read from the ELF file), then dlopen.
#include "mllm/core/plugin.h"
#include "mllm/core/registry.h"

#include <dlfcn.h>
#include <elf.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {
namespace {

std::map<std::string, std::string> parse_stamp(const std::string& text) {
  std::map<std::string, std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string field = text.substr(start, end - start);
    const std::size_t eq = field.find('=');
    if (eq != std::string::npos) out[field.substr(0, eq)] = field.substr(eq + 1);
    start = end + 1;
  }
  return out;
}

std::string describe(std::map<std::string, std::string> s) {
  auto get = [&](const char* k) { return s.count(k) ? s[k] : std::string("?"); };
  return fmt::format("mllm {} (plugin ABI {}, LibTorch {}, _GLIBCXX_USE_CXX11_ABI={})",
                     get("mllm_version"), get("plugin_abi"), get("torch"), get("cxx11_abi"));
}

void check_stamp(const std::string& path) {
  const std::string stamp = read_plugin_stamp(path);
  const auto ours = parse_stamp(plugin_stamp());
  if (stamp.empty())
    throw ConfigError(fmt::format(
        "plugin '{}' carries no mllm build stamp, so its mllm version is unknown; add "
        "MLLM_PLUGIN_STAMP(); (mllm/core/plugin.h) to one of its .cpp files and rebuild it "
        "against this {}", path, describe(ours)));
  const auto theirs = parse_stamp(stamp);
  for (const char* field : {"mllm_version", "plugin_abi", "torch", "cxx11_abi"}) {
    auto it = theirs.find(field);
    if (it == theirs.end() || it->second != ours.at(field))
      throw ConfigError(fmt::format(
          "plugin '{}' was built against {}, but this is {}; rebuild the plugin against this "
          "mllm (find_package(mllm {}) with this installation's prefix)",
          path, describe(theirs), describe(ours), ours.at("mllm_version")));
  }
}

}  // namespace

const char* plugin_stamp() { return MLLM_PLUGIN_STAMP_TEXT; }

std::string read_plugin_stamp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(fmt::format("plugin '{}': cannot open it for reading", path));
  auto fail = [&](const std::string& why) -> ConfigError {
    return ConfigError(fmt::format("plugin '{}' is not a 64-bit ELF shared library ({})", path, why));
  };
  std::error_code ec;
  const auto file_size = static_cast<uint64_t>(std::filesystem::file_size(path, ec));
  if (ec) throw fail("cannot get its size: " + ec.message());
  auto read_at = [&](uint64_t offset, void* out, uint64_t n) {
    if (offset > file_size || n > file_size - offset) throw fail("truncated");
    f.seekg(static_cast<std::streamoff>(offset));
    f.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!f) throw fail("read error");
  };
  Elf64_Ehdr eh;
  read_at(0, &eh, sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) throw fail("no ELF magic");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) throw fail("not ELFCLASS64");
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum)
    throw fail("no usable section table");
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  read_at(eh.e_shoff, sections.data(), sizeof(Elf64_Shdr) * sections.size());
  const Elf64_Shdr& names_hdr = sections[eh.e_shstrndx];
  std::string names(names_hdr.sh_size, '\0');
  read_at(names_hdr.sh_offset, names.data(), names.size());
  for (const auto& sh : sections) {
    if (sh.sh_name >= names.size()) continue;
    if (std::strcmp(names.c_str() + sh.sh_name, kPluginStampSection) != 0) continue;
    if (sh.sh_size > 4096) throw fail("oversized stamp section");
    std::string text(sh.sh_size, '\0');
    read_at(sh.sh_offset, text.data(), text.size());
    return text.substr(0, text.find('\0'));
  }
  return "";
}

namespace {
std::string g_registering_plugin;  // the plugin whose entry point runs now; "" otherwise
}  // namespace

namespace detail {
std::string registering_source() {
  return g_registering_plugin.empty() ? "mllm's built-ins" : "plugin '" + g_registering_plugin + "'";
}
}  // namespace detail

void load_plugins(const std::vector<std::string>& paths) {
  static std::set<std::string> loaded;
  for (const auto& path : paths) {
    std::error_code ec;
    std::string canon = std::filesystem::weakly_canonical(path, ec).string();
    if (loaded.count(canon)) continue;
    if (!std::filesystem::exists(path))
      throw ConfigError("plugin '" + path + "': no such file (plugins: paths are relative to the "
                        "working directory)");
    if (!std::filesystem::is_regular_file(path))
      throw ConfigError("plugin '" + path + "' is not a regular file; list the shared library "
                        "(.so) itself");
    check_stamp(path);  // before dlopen: no code of a mismatched plugin runs
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
    // Whatever the entry point throws is the plugin's failure to start: bad input, exit 2.
    struct Registering {  // names this plugin in a duplicate-name error (registry.h)
      explicit Registering(const std::string& p) { g_registering_plugin = p; }
      ~Registering() { g_registering_plugin.clear(); }
    } registering(canon);
    try {
      entry();
    } catch (const std::exception& e) {
      throw ConfigError("plugin '" + path + "': " + kPluginEntryPoint + "() failed: " + e.what());
    } catch (...) {
      throw ConfigError("plugin '" + path + "': " + kPluginEntryPoint +
                        "() failed with an exception that is not a std::exception");
    }
    loaded.insert(canon);
  }
}

std::string libmllm_module_path(const char* env_var, const char* file_name) {
  if (const char* env = std::getenv(env_var); env && *env) return env;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&libmllm_module_path), &info) && info.dli_fname)
    return (std::filesystem::path(info.dli_fname).parent_path() / file_name).string();
  return file_name;
}

}  // namespace mllm
