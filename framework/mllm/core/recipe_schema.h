// The declaration table behind recipe.h: each key once, with type, help, range check and how it
// is read from and written to YAML. Internal to core (recipe.cpp and its tests).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "mllm/core/recipe.h"

namespace mllm::detail {

// One key (leaf) or one section (children non-empty). `read` throws std::invalid_argument with
// "expected ..." text, which the walker turns into a ConfigError with location and key path.
struct KeySpec {
  std::string name;
  std::string type;   // "integer", "number", "string", "bool", "list of strings", ...
  std::string help;
  std::vector<std::string> aliases;  // common other spellings, for did-you-mean only
  std::vector<KeySpec> children;
  bool section = false;              // a section even with no children (an empty options section)
  std::function<void(const YAML::Node&)> read;
  std::function<YAML::Node()> write;
  bool is_section() const { return section || !children.empty(); }
};

// The schema bound to `r`: reading through it fills r, writing reads r. The options sections
// (options.h) follow the component names currently in r (model.type, ...) and the callbacks
// whose plugins are loaded: their values are filled with the declared defaults where missing,
// and values of undeclared keys are dropped, so call it again after changing a component name.
KeySpec recipe_schema(Recipe& r);

// The KeySpec leaf for one declared option, bound to `value` (which it reads into and writes).
KeySpec option_key(const OptionSpec& spec, OptionValue& value);

}  // namespace mllm::detail
