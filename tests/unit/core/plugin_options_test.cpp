// Options declared by plugin components (options.h): read from their own recipe sections with
// the built-in strictness, dumped, diffed and listed. The test plugin (tests/plugins/
// test_plugin.cpp) declares schedule `plugin_half` { factor: number in (0, 1], default 0.5 } and
// callback `plugin_counter` { every: integer >= 1 = 10, mode: steps|tokens = steps,
// verbose: bool = false, tags: list of strings = [a] }.
// Each TEST runs in its own process (gtest_discover_tests), so the plugin loads afresh.
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/core/options.h"
#include "mllm/core/recipe.h"

using mllm::ConfigError;
using mllm::load_recipe_string;

namespace {

const std::string kPlugin = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin.so";
const std::string kBase = "plugins: [" + kPlugin + "]\ndata: {corpus: [x.txt]}\n";

std::string error_of(const std::string& yaml) {
  try {
    load_recipe_string(yaml, "r.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

}  // namespace

TEST(PluginOptions, ReadsValuesAndDefaults) {
  auto r = load_recipe_string(kBase + "schedule: {type: plugin_half, options: {factor: 0.25}}\n"
                                      "callbacks: [metrics, plugin_counter]\n"
                                      "plugin_counter: {every: 3, tags: [x, y]}\n");
  EXPECT_EQ(r.schedule.options.number("factor"), 0.25);
  const auto& c = r.options_of_callback("plugin_counter");
  EXPECT_EQ(c.integer("every"), 3);
  EXPECT_EQ(c.string("mode"), "steps");  // the declared default
  EXPECT_EQ(c.boolean("verbose"), false);
  EXPECT_EQ(c.strings("tags"), (std::vector<std::string>{"x", "y"}));
  // Defaults when the section is absent.
  auto d = load_recipe_string(kBase + "schedule: {type: plugin_half}\n");
  EXPECT_EQ(d.schedule.options.number("factor"), 0.5);
  // A loaded callback's section holds its defaults, listed in `callbacks:` or not (as eval:).
  EXPECT_EQ(d.options_of_callback("plugin_counter").integer("every"), 10);
  EXPECT_TRUE(d.options_of_callback("progress").empty());  // declares none
  // A plugin asking for an undeclared key or the wrong type is a plugin bug, named as such.
  try {
    (void)r.schedule.options.integer("factor");
    FAIL();
  } catch (const mllm::Error& e) {
    EXPECT_HAS(std::string(e.what()), "option 'factor' in schedule.options is not declared as an integer");
  }
  try {
    (void)r.schedule.options.number("fator");
    FAIL();
  } catch (const mllm::Error& e) {
    EXPECT_HAS(std::string(e.what()), "option 'fator' is not declared in schedule.options (declared: factor)");
  }
}

TEST(PluginOptions, UnknownKeyGetsSuggestionWithLocation) {
  std::string e = error_of(kBase + "schedule:\n  type: plugin_half\n  options:\n    facter: 0.3\n");
  EXPECT_HAS(e, "r.yaml:6:5");
  EXPECT_HAS(e, "unknown key 'schedule.options.facter' (did you mean schedule.options.factor?)");
  EXPECT_HAS(e, "valid keys under schedule.options: factor");
  e = error_of(kBase + "callbacks: [plugin_counter]\nplugin_counter: {evrey: 2}\n");
  EXPECT_HAS(e, "unknown key 'plugin_counter.evrey' (did you mean plugin_counter.every?)");
}

TEST(PluginOptions, TypesRangesAndChoicesAreChecked) {
  std::string e = error_of(kBase + "schedule: {type: plugin_half, options: {factor: 0}}\n");
  EXPECT_HAS(e, "r.yaml:3:");
  EXPECT_HAS(e, "schedule.options.factor: must be in (0, 1], got 0");
  e = error_of(kBase + "schedule: {type: plugin_half, options: {factor: half}}\n");
  EXPECT_HAS(e, "schedule.options.factor: expected a number, got 'half'");
  e = error_of(kBase + "callbacks: [plugin_counter]\nplugin_counter: {every: 0}\n");
  EXPECT_HAS(e, "r.yaml:4:");
  EXPECT_HAS(e, "plugin_counter.every: must be >= 1, got 0");
  e = error_of(kBase + "callbacks: [plugin_counter]\nplugin_counter: {mode: bytes}\n");
  EXPECT_HAS(e, "expected one of steps, tokens, got 'bytes'");
  e = error_of(kBase + "callbacks: [plugin_counter]\nplugin_counter: {verbose: 1}\n");
  EXPECT_HAS(e, "expected true or false, got '1'");
}

TEST(PluginOptions, SectionsOfComponentsNotInUse) {
  // The built-in model declares no options.
  std::string e = error_of(kBase + "model: {options: {expansion: 4}}\n");
  EXPECT_HAS(e, "unknown key 'model.options.expansion': model 'minillm' declares no options");
  EXPECT_HAS(e, "is it listed under `plugins:`?");
  // Options for the schedule while another schedule is selected.
  e = error_of(kBase + "schedule: {options: {factor: 0.3}}\n");
  EXPECT_HAS(e, "schedule 'warmup_cosine' declares no options");
  // A callback's section while `callbacks:` does not list it: valid, as the built-in eval: is.
  auto r = load_recipe_string(kBase + "callbacks: [metrics]\nplugin_counter: {every: 2}\n");
  EXPECT_EQ(r.options_of_callback("plugin_counter").integer("every"), 2);
  // Without the plugin, an unknown top-level section says where such sections come from.
  e = error_of("data: {corpus: [x.txt]}\nloss_ema: {every: 2}\n");
  EXPECT_HAS(e, "unknown key 'loss_ema'");
  EXPECT_HAS(e, "valid once its plugin is listed under `plugins:`");
}

TEST(PluginOptions, DumpRoundTripAndDiff) {
  auto r = load_recipe_string(kBase + "schedule: {type: plugin_half, options: {factor: 0.25}}\n"
                                      "callbacks: [plugin_counter]\nplugin_counter: {every: 3}\n");
  const std::string yaml = mllm::to_yaml(r);
  EXPECT_HAS(yaml, "  options:\n    factor: 0.25\n");
  EXPECT_HAS(yaml, "plugin_counter:\n  every: 3\n  mode: steps\n  verbose: false\n  tags:\n    - a\n");
  auto back = load_recipe_string(yaml, "resolved.yaml");
  EXPECT_EQ(mllm::flatten(back), mllm::flatten(r));
  EXPECT_TRUE(mllm::recipe_diff(back, r).empty());

  auto other = load_recipe_string(kBase + "schedule: {type: plugin_half, options: {factor: 0.5}}\n");
  auto diff = mllm::recipe_diff(r, other);
  std::vector<std::string> keys;
  for (const auto& d : diff) keys.push_back(d.key + "=" + d.a + "->" + d.b);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "schedule.options.factor=0.25->0.5"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "plugin_counter.every=3->10"), keys.end());

  // Components without options (the built-in model, tokenizer, schedule) dump no options: key.
  auto plain = load_recipe_string("data: {corpus: [x.txt]}\n");
  EXPECT_EQ(mllm::to_yaml(plain).find("options"), std::string::npos);
}

TEST(PluginOptions, ReferenceListsDeclaredOptions) {
  load_recipe_string(kBase);  // loads the plugin
  const std::string ref = mllm::recipe_reference();
  EXPECT_HAS(ref, "### schedule `plugin_half`: options under `schedule.options:` (when "
                  "schedule.type is `plugin_half`)");
  EXPECT_HAS(ref, "| `schedule.options.factor` | number in (0, 1] | `0.5` | lr multiplier |");
  EXPECT_HAS(ref, "| `plugin_counter.every` | integer >= 1 | `10` | count every N steps |");
  EXPECT_HAS(ref, "| `plugin_counter.mode` | one of steps, tokens | `steps` | what to count |");
}

TEST(OptionSchema, RefusesBadDeclarations) {
  using mllm::OptionRange;
  using mllm::OptionSchema;
  EXPECT_THROW(OptionSchema().integer("n", 0, "h", OptionRange::at_least(1)), mllm::Error);
  EXPECT_THROW(OptionSchema().number("x", 1.0, "h", OptionRange::greater_than(1)), mllm::Error);
  EXPECT_THROW(OptionSchema().string("s", "c", "h", {"a", "b"}), mllm::Error);
  EXPECT_THROW(OptionSchema().boolean("Bad-Key", true, "h"), mllm::Error);
  EXPECT_THROW(OptionSchema().boolean("k", true, "h").boolean("k", false, "h"), mllm::Error);
  EXPECT_THROW(mllm::register_options("widget", "w", OptionSchema()), mllm::Error);
  EXPECT_THROW(mllm::register_options("callback", "train", OptionSchema()), mllm::Error);
  EXPECT_THROW(mllm::register_options("callback", "", OptionSchema()), mllm::Error);
  EXPECT_THROW(mllm::register_options("callback", "my.cb", OptionSchema()), mllm::Error);
  mllm::register_options("model", "schema_test_model", OptionSchema().integer("k", 1, "h"));
  EXPECT_THROW(mllm::register_options("model", "schema_test_model", OptionSchema()), mllm::Error);
  EXPECT_EQ(OptionRange::between(1, 4).violation(5), "must be in [1, 4], got 5");
  EXPECT_EQ(OptionRange::between(1, 4).violation(4), "");
}
