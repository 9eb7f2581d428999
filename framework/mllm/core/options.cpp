// Component-declared options: the schema builder, typed access, and the registry of schemas.
#include "mllm/core/options.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <regex>

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {
namespace {

struct SchemaTable {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, OptionSchema> schemas;
};

SchemaTable& table() {
  static SchemaTable t;
  return t;
}

const std::vector<std::string>& kinds() {
  static const std::vector<std::string> k = {"callback", "model", "optimizer", "schedule",
                                             "tokenizer"};
  return k;
}

}  // namespace

std::string OptionRange::describe() const {
  if (min && max)
    return fmt::format("in {}{}, {}{}", min_exclusive ? "(" : "[", *min, *max,
                       max_exclusive ? ")" : "]");
  if (min) return fmt::format("{} {}", min_exclusive ? ">" : ">=", *min);
  if (max) return fmt::format("{} {}", max_exclusive ? "<" : "<=", *max);
  return "";
}

std::string OptionRange::violation(double v) const {
  const bool lo_ok = !min || (min_exclusive ? v > *min : v >= *min);
  const bool hi_ok = !max || (max_exclusive ? v < *max : v <= *max);
  if (lo_ok && hi_ok) return "";
  return fmt::format("must be {}, got {}", describe(), v);
}

OptionSchema& OptionSchema::add(OptionSpec spec) {
  static const std::regex re("[a-z][a-z0-9_]*");
  if (!std::regex_match(spec.key, re))
    throw Error(fmt::format("option key '{}': use lower-case letters, digits and '_', starting "
                            "with a letter", spec.key));
  for (const auto& s : specs_)
    if (s.key == spec.key) throw Error(fmt::format("option '{}' is declared twice", spec.key));
  if (spec.type == OptionType::kInteger || spec.type == OptionType::kNumber) {
    const double v = spec.type == OptionType::kInteger
                         ? static_cast<double>(std::get<int64_t>(spec.default_value))
                         : std::get<double>(spec.default_value);
    if (!std::isfinite(v))
      throw Error(fmt::format("option '{}': the default must be finite", spec.key));
    if (auto why = spec.range.violation(v); !why.empty())
      throw Error(fmt::format("option '{}': the default {}", spec.key, why));
  }
  if (spec.type == OptionType::kString && !spec.choices.empty()) {
    const auto& d = std::get<std::string>(spec.default_value);
    if (std::find(spec.choices.begin(), spec.choices.end(), d) == spec.choices.end())
      throw Error(fmt::format("option '{}': the default '{}' is not one of its choices", spec.key, d));
  }
  specs_.push_back(std::move(spec));
  return *this;
}

OptionSchema& OptionSchema::boolean(std::string key, bool default_value, std::string help) {
  return add({std::move(key), OptionType::kBool, default_value, std::move(help), {}, {}});
}
OptionSchema& OptionSchema::integer(std::string key, int64_t default_value, std::string help,
                                    OptionRange range) {
  return add({std::move(key), OptionType::kInteger, default_value, std::move(help), range, {}});
}
OptionSchema& OptionSchema::number(std::string key, double default_value, std::string help,
                                   OptionRange range) {
  return add({std::move(key), OptionType::kNumber, default_value, std::move(help), range, {}});
}
OptionSchema& OptionSchema::string(std::string key, std::string default_value, std::string help,
                                   std::vector<std::string> choices) {
  return add({std::move(key), OptionType::kString, std::move(default_value), std::move(help), {},
              std::move(choices)});
}
OptionSchema& OptionSchema::strings(std::string key, std::vector<std::string> default_value,
                                    std::string help) {
  return add({std::move(key), OptionType::kStringList, std::move(default_value), std::move(help),
              {}, {}});
}

const OptionValue& Options::at(const std::string& key) const {
  auto it = values.find(key);
  if (it == values.end()) {
    std::vector<std::string> known;
    for (const auto& kv : values) known.push_back(kv.first);
    throw Error(fmt::format("option '{}' is not declared in {} (declared: {}); declare it in the "
                            "component's OptionSchema", key, section.empty() ? "this section" : section,
                            known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
  }
  return it->second;
}

#define MLLM_OPTION_GET(method, T, type_text)                                                   \
  const T& get_##method(const Options& o, const OptionValue& v, const std::string& key) {       \
    if (!std::holds_alternative<T>(v))                                                          \
      throw Error(fmt::format("option '{}' in {} is not declared as {}", key, o.section,         \
                              type_text));                                                      \
    return std::get<T>(v);                                                                      \
  }
namespace {
MLLM_OPTION_GET(bool, bool, "a bool")
MLLM_OPTION_GET(int, int64_t, "an integer")
MLLM_OPTION_GET(double, double, "a number")
MLLM_OPTION_GET(string, std::string, "a string")
MLLM_OPTION_GET(strings, std::vector<std::string>, "a list of strings")
}  // namespace
#undef MLLM_OPTION_GET

bool Options::boolean(const std::string& key) const { return get_bool(*this, at(key), key); }
int64_t Options::integer(const std::string& key) const { return get_int(*this, at(key), key); }
double Options::number(const std::string& key) const { return get_double(*this, at(key), key); }
const std::string& Options::string(const std::string& key) const {
  return get_string(*this, at(key), key);
}
const std::vector<std::string>& Options::strings(const std::string& key) const {
  return get_strings(*this, at(key), key);
}

std::string options_section(const std::string& kind, const std::string& name) {
  if (kind == "model") return "model.options";
  if (kind == "tokenizer") return "data.tokenizer.options";
  if (kind == "optimizer") return "optim.options";
  if (kind == "schedule") return "schedule.options";
  if (kind == "callback") return name;
  throw Error(fmt::format("unknown component kind '{}' for options; one of: {}", kind,
                          fmt::join(kinds(), ", ")));
}

void register_options(const std::string& kind, const std::string& name, OptionSchema schema) {
  options_section(kind, name);  // validates the kind
  // The name is written in recipes (model.type: NAME; a callback's section is named NAME).
  static const std::regex name_re("[A-Za-z0-9_][A-Za-z0-9_-]*");
  if (!std::regex_match(name, name_re))
    throw Error(fmt::format("{} name '{}' cannot declare options: use letters, digits, '_' and "
                            "'-' (it names a recipe section or value)", kind, name));
  if (kind == "callback") {
    static const std::vector<std::string> builtin = {
        "plugins", "callbacks", "defaults", "run", "data", "model", "train", "optim",
        "schedule", "dist", "checkpoint", "eval", "sample", "log"};
    if (std::find(builtin.begin(), builtin.end(), name) != builtin.end())
      throw Error(fmt::format("callback '{}' cannot declare options: its section would be the "
                              "built-in top-level section '{}'; rename the callback", name, name));
  }
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.schemas.emplace(std::make_pair(kind, name), std::move(schema)).second)
    throw Error(fmt::format("{} '{}' declares its options twice (check plugins for a clash)", kind,
                            name));
}

const OptionSchema* find_options(const std::string& kind, const std::string& name) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.schemas.find({kind, name});
  return it == t.schemas.end() ? nullptr : &it->second;  // std::map: stable addresses
}

std::vector<std::pair<std::pair<std::string, std::string>, const OptionSchema*>> all_options() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::pair<std::pair<std::string, std::string>, const OptionSchema*>> out;
  for (const auto& kv : t.schemas) out.emplace_back(kv.first, &kv.second);
  return out;
}

}  // namespace mllm
