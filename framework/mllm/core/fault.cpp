// MLLM_FAULT parsing and lookup (see fault.h for the grammar).
#include "mllm/core/fault.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "mllm/core/error.h"

namespace mllm {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

double number(const std::string& entry, const std::string& key, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0')
    throw ConfigError("MLLM_FAULT: '" + entry + "': " + key + " must be a number, got '" + v + "'");
  return d;
}

}  // namespace

std::vector<Fault> parse_faults(const std::string& spec) {
  static const std::vector<std::string> kKinds = {"throw", "sleep", "nan", "desync", "enospc",
                                                  "kill", "skew", "prepare_throw", "prepare_kill"};
  std::vector<Fault> out;
  for (const std::string& entry : split(spec, ',')) {
    auto parts = split(entry, ':');
    Fault f;
    f.kind = parts.empty() ? "" : parts[0];
    if (std::find(kKinds.begin(), kKinds.end(), f.kind) == kKinds.end())
      throw ConfigError("MLLM_FAULT: '" + entry +
                        "': unknown kind; expected throw, sleep, nan, desync, enospc, kill, skew, "
                        "prepare_throw or prepare_kill");
    for (std::size_t i = 1; i < parts.size(); ++i) {
      const auto eq = parts[i].find('=');
      const std::string k = parts[i].substr(0, eq);
      const std::string v = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
      if (k == "rank") f.rank = static_cast<int>(number(entry, k, v));
      else if (k == "step" || k == "segment") f.step = static_cast<int64_t>(number(entry, k, v));
      else if (k == "seconds") f.seconds = number(entry, k, v);
      else if (k == "by") f.by = number(entry, k, v);
      else if (k == "file" && v.empty())
        throw ConfigError("MLLM_FAULT: '" + entry + "': file= needs a file name");
      else if (k == "file") f.file = v;
      else
        throw ConfigError("MLLM_FAULT: '" + entry + "': unknown key '" + k +
                          "'; expected rank=, step=, segment=, seconds=, by= or file=");
    }
    if (f.step < 0)
      throw ConfigError("MLLM_FAULT: '" + entry + "': " +
                        (f.kind.rfind("prepare_", 0) == 0 ? "segment=S" : "step=N") + " is required");
    out.push_back(f);
  }
  return out;
}

std::optional<Fault> injected_fault(const std::string& kind, int rank, int64_t step) {
  static std::once_flag once;
  static std::vector<Fault> faults;
  static const char* spec = std::getenv("MLLM_FAULT");
  if (spec == nullptr || *spec == '\0') return std::nullopt;
  std::call_once(once, [] { faults = parse_faults(spec); });
  for (const Fault& f : faults)
    if (f.kind == kind && f.step == step && (rank < 0 || f.rank == rank)) return f;
  return std::nullopt;
}

}  // namespace mllm
