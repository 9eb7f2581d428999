// Options that a component (usually a plugin's) declares for itself: key, type, default, help
// and range, read from the recipe section that belongs to the component with exactly the
// strictness of the built-in keys (unknown key -> did-you-mean, wrong type or range -> file:line),
// listed by `mllm-train RECIPE --help-recipe`, written to recipe.resolved.yaml, saved in
// checkpoints and compared on resume. Walkthrough: docs/plugins.md.
//
// Where a component's options live in a recipe:
//   kind "model"      model.options:            (read when model.type names the component)
//   kind "tokenizer"  data.tokenizer.options:   (when data.tokenizer.type names it)
//   kind "optimizer"  optim.options:            (when optim.type names it)
//   kind "schedule"   schedule.options:         (when schedule.type names it)
//   kind "callback"   a top-level section named after the callback (valid whenever the plugin is
//                     loaded, like the built-in callbacks' eval: or sample: sections)
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace mllm {

// One option value. Integers are int64_t, numbers double, lists are lists of strings.
using OptionValue = std::variant<bool, int64_t, double, std::string, std::vector<std::string>>;

enum class OptionType { kBool, kInteger, kNumber, kString, kStringList };

// Bounds for an integer or number option; unset sides are open-ended.
struct OptionRange {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;

  static OptionRange at_least(double lo) { return {lo, std::nullopt, false, false}; }
  static OptionRange greater_than(double lo) { return {lo, std::nullopt, true, false}; }
  static OptionRange between(double lo, double hi) { return {lo, hi, false, false}; }  // [lo, hi]
  // "in [1, 16]", ">= 1", "< 1", or "" when unbounded (the --help-recipe type column).
  std::string describe() const;
  // "must be in [1, 16], got 64" for a value outside the bounds, "" for one inside.
  std::string violation(double v) const;
};

// One declared option.
struct OptionSpec {
  std::string key;                   // [a-z0-9_]+, unique within the schema
  OptionType type = OptionType::kString;
  OptionValue default_value;         // of `type`'s alternative; checked against range/choices
  std::string help;
  OptionRange range;                 // integer and number options only
  std::vector<std::string> choices;  // string options only; empty = any string
};

// The options of one component, built fluently:
//   mllm::OptionSchema()
//       .integer("expansion", 4, "feed-forward width as a multiple of d_model",
//                mllm::OptionRange::between(1, 64))
//       .string("activation", "gelu", "feed-forward activation", {"gelu", "gelu_tanh"});
// Each adder throws mllm::Error when the key is malformed or taken twice, or the default is
// outside its own range or choices (a plugin bug, reported when the plugin registers).
class OptionSchema {
 public:
  OptionSchema& boolean(std::string key, bool default_value, std::string help);
  OptionSchema& integer(std::string key, int64_t default_value, std::string help,
                        OptionRange range = {});
  OptionSchema& number(std::string key, double default_value, std::string help,
                       OptionRange range = {});
  OptionSchema& string(std::string key, std::string default_value, std::string help,
                       std::vector<std::string> choices = {});
  OptionSchema& strings(std::string key, std::vector<std::string> default_value, std::string help);

  const std::vector<OptionSpec>& specs() const { return specs_; }

 private:
  OptionSchema& add(OptionSpec spec);
  std::vector<OptionSpec> specs_;
};

// The values of one component's options, as resolved from the recipe (defaults filled in).
// Typed getters throw mllm::Error when `key` was not declared or was declared with another type
// (a mismatch between a plugin's schema and its code).
class Options {
 public:
  bool boolean(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& string(const std::string& key) const;
  const std::vector<std::string>& strings(const std::string& key) const;

  bool empty() const { return values.empty(); }
  bool operator==(const Options& o) const { return values == o.values; }

  std::string section;                        // recipe path, e.g. "model.options" (for errors)
  std::map<std::string, OptionValue> values;  // key -> value, every declared key present

 private:
  const OptionValue& at(const std::string& key) const;
};

// Declares the options of component `name` of `kind` ("model", "tokenizer", "optimizer",
// "schedule", "callback"; the table at the top of this file says where they are read). Call it
// from a plugin's mllm_register_plugin(), next to the registry add(). Throws mllm::Error for an
// unknown kind, an empty name or one with characters other than letters, digits, '_' and '-', a
// second schema for the same component, or a callback whose name is a built-in top-level
// section (run, data, model, ...).
void register_options(const std::string& kind, const std::string& name, OptionSchema schema);

// The schema declared for (kind, name), or nullptr when it declared none.
const OptionSchema* find_options(const std::string& kind, const std::string& name);

// Every declared schema as (kind, name) -> schema, sorted by kind then name.
std::vector<std::pair<std::pair<std::string, std::string>, const OptionSchema*>> all_options();

// The recipe section that holds the options of a component of `kind` named `name`
// ("model" -> "model.options"; "callback" -> name). Throws mllm::Error for an unknown kind.
std::string options_section(const std::string& kind, const std::string& name);

}  // namespace mllm
