// Recipe loading: walks the composed YAML tree against the key table, reports unknown,
// misplaced and mistyped keys with their source location, then checks cross-field rules.
#include "mllm/core/recipe.h"

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "mllm/core/error.h"
#include "mllm/core/plugin.h"
#include "mllm/core/recipe_schema.h"
#include "mllm/core/suggest.h"
#include "mllm/core/yaml_compose.h"

namespace mllm {
namespace {

using detail::KeySpec;

// Every leaf path in the schema, e.g. "optim.lr".
void collect_paths(const KeySpec& s, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& c : s.children) {
    std::string p = prefix.empty() ? c.name : prefix + "." + c.name;
    out.push_back(p);
    if (c.is_section()) collect_paths(c, p, out);
  }
}

std::string unknown_key_message(const KeySpec& root, const KeySpec& section,
                                const std::string& prefix, const std::string& key) {
  const std::string path = prefix.empty() ? key : prefix + "." + key;
  // The same key name elsewhere: a valid key in the wrong section.
  std::vector<std::string> all;
  collect_paths(root, "", all);
  std::vector<std::string> homes;
  for (const auto& p : all) {
    auto dot = p.rfind('.');
    std::string last = dot == std::string::npos ? p : p.substr(dot + 1);
    if (last == key && p != path) homes.push_back(p);
  }
  if (!homes.empty())
    return fmt::format("key '{}' is not valid in section '{}'; it belongs at {} (move it there)",
                       path, prefix.empty() ? "<top level>" : prefix, join(homes, " or "));
  if (section.children.empty())  // an options section of a component that declares none
    return fmt::format("unknown key '{}': {} (built-in components declare none; a plugin's "
                       "component declares its options when the plugin loads: is it listed "
                       "under `plugins:`?)", path, section.help);
  // A typo or another framework's name: nearest name or alias in this section.
  std::vector<std::string> names;
  std::vector<std::string> owners;
  for (const auto& c : section.children) {
    names.push_back(c.name);
    owners.push_back(c.name);
    for (const auto& a : c.aliases) {
      names.push_back(a);
      owners.push_back(c.name);
    }
  }
  std::string hint = closest_match(key, names);
  std::string msg = fmt::format("unknown key '{}'", path);
  if (!hint.empty()) {
    std::size_t i = std::find(names.begin(), names.end(), hint) - names.begin();
    msg += fmt::format(" (did you mean {}{}?)", prefix.empty() ? "" : prefix + ".", owners[i]);
  }
  std::vector<std::string> valid;
  for (const auto& c : section.children) valid.push_back(c.name);
  msg += fmt::format("; valid keys{}: {}", prefix.empty() ? "" : " under " + prefix, join(valid));
  if (prefix.empty() && hint.empty())
    msg += " (a plugin callback's options section is valid once its plugin is listed under "
           "`plugins:`)";
  return msg;
}

void read_leaf(const KeySpec& spec, const YAML::Node& node, const std::string& path,
               const ComposedYaml& composed) {
  try {
    spec.read(node);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{}: {}: {} ({}: {})", composed.locate(path).str(), path,
                                  e.what(), spec.type, spec.help));
  }
}

void read_section(const KeySpec& root, const KeySpec& section, const YAML::Node& node,
                  const std::string& prefix, const ComposedYaml& composed) {
  if (node.IsNull()) return;  // `eval:` with nothing under it keeps the defaults
  if (!node.IsMap())
    throw ConfigError(fmt::format("{}: {}: expected a mapping of keys ({}), got {}",
                                  composed.locate(prefix).str(), prefix,
                                  section.help, node.IsSequence() ? "a list" : "a scalar"));
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const KeySpec* spec = nullptr;
    for (const auto& c : section.children)
      if (c.name == key) spec = &c;
    if (!spec)
      throw ConfigError(composed.locate(path).str() + ": " +
                        unknown_key_message(root, section, prefix, key));
    if (spec->is_section()) {
      read_section(root, *spec, kv.second, path, composed);
      continue;
    }
    read_leaf(*spec, kv.second, path, composed);
  }
}

// The keys that decide the rest of the schema: which plugins to load, and the component names
// whose declared options make up the options sections. Read (and checked) before the full walk.
void read_component_keys(const KeySpec& root, const ComposedYaml& composed) {
  static const char* const paths[] = {"plugins", "model.type", "data.tokenizer.type", "optim.type",
                                      "schedule.type"};
  for (const char* path : paths) {
    const KeySpec* spec = &root;
    // yaml-cpp: `=` on a Node assigns into the tree and a non-const operator[] inserts, so the
    // walk only reads (const access) and moves with reset().
    YAML::Node node;
    node.reset(composed.root);
    std::string p(path);
    bool found = true;
    for (std::size_t start = 0; found;) {
      const std::size_t dot = p.find('.', start);
      const std::string part = p.substr(start, dot == std::string::npos ? dot : dot - start);
      const KeySpec* child = nullptr;
      for (const auto& c : spec->children)
        if (c.name == part) child = &c;
      const YAML::Node& cur = node;
      if (!child || !cur.IsMap() || !cur[part]) found = false;
      if (!found) break;
      spec = child;
      node.reset(cur[part]);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (found && !spec->is_section()) read_leaf(*spec, node, p, composed);
  }
}

// Cross-field rules. Each error names the keys, where they were set, and the fix.
void validate(const Recipe& r, const ComposedYaml& c) {
  auto fail = [&](const std::string& path, const std::string& msg) {
    throw ConfigError(c.locate(path).str() + ": " + path + ": " + msg);
  };
  const auto& m = r.model;
  if (m.d_model % m.n_heads != 0)
    fail("model.n_heads",
         fmt::format("model.d_model={} is not divisible by model.n_heads={}; choose n_heads "
                     "dividing d_model, or d_model a multiple of n_heads (e.g. {})",
                     m.d_model, m.n_heads, (m.d_model / m.n_heads + 1) * m.n_heads));
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0)
    fail("model.n_kv_heads", fmt::format("model.n_kv_heads={} must divide model.n_heads={}",
                                         m.n_kv_heads, m.n_heads));
  if (m.max_seq_len > 0 && m.max_seq_len < r.data.seq_len)
    fail("model.max_seq_len",
         fmt::format("model.max_seq_len={} is shorter than data.seq_len={}; raise it or set 0 "
                     "(= data.seq_len)", m.max_seq_len, r.data.seq_len));
  if (r.schedule.min_lr > r.optim.lr)
    fail("schedule.min_lr", fmt::format("schedule.min_lr={} must be <= optim.lr={}",
                                        r.schedule.min_lr, r.optim.lr));
  if (r.train.global_batch % r.train.micro_batch != 0)
    fail("train.global_batch",
         fmt::format("train.global_batch={} is not divisible by train.micro_batch={}; set "
                     "global_batch to a multiple of micro_batch x world size",
                     r.train.global_batch, r.train.micro_batch));
  if (r.train.stop_at_step && *r.train.stop_at_step > r.train.max_steps)
    fail("train.stop_at_step", fmt::format("train.stop_at_step={} is past train.max_steps={}",
                                           *r.train.stop_at_step, r.train.max_steps));
  if (!r.data.sources.empty() && !r.data.corpus.empty())
    fail("data.sources",
         fmt::format("data.corpus is set too (at {}); a recipe trains on data.corpus or on the "
                     "mixture data.sources: set data.corpus: [] to train on the sources",
                     c.locate("data.corpus").str()));
  if (r.data.corpus.empty() && r.data.sources.empty())
    fail("data.corpus", "no corpus given; list .txt, .jsonl or .parquet files or globs, e.g. "
                        "[data/tang300/*.jsonl], or a mixture under data.sources");
}

Recipe build(const ComposedYaml& composed, const std::string& source, RecipePlugins plugins) {
  Recipe r;
  // Two passes: plugins and component names first, since they decide which option sections
  // exist; then everything, against the schema those give.
  read_component_keys(detail::recipe_schema(r), composed);
  if (plugins == RecipePlugins::kLoad) load_plugins(r.plugins);
  KeySpec root = detail::recipe_schema(r);
  read_section(root, root, composed.root, "", composed);
  validate(r, composed);
  r.source = source;
  return r;
}

}  // namespace

std::string share_dir() {
  if (const char* env = std::getenv("MLLM_SHARE_DIR"); env && *env) return env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "share" / "mllm").string();
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string share = share_dir();
  Recipe r = build(compose_yaml(path, overrides, share.empty() ? "" : share + "/recipes"), path,
                   RecipePlugins::kLoad);
  r.data.corpus_fallback_dir = share;
  return r;
}

Recipe load_recipe_string(const std::string& yaml, const std::string& name,
                          const std::vector<std::string>& overrides, const std::string& base_dir,
                          RecipePlugins plugins) {
  return build(compose_yaml_string(yaml, name, base_dir, overrides), name, plugins);
}

const Options& Recipe::options_of_callback(const std::string& name) const {
  static const Options none;
  auto it = callback_options.find(name);
  return it == callback_options.end() ? none : it->second;
}

void validate_for_world(const Recipe& r, int world_size) {
  const int64_t unit = r.train.micro_batch * world_size;
  if (world_size < 1 || r.train.global_batch % unit != 0) {
    int64_t lo = std::max<int64_t>(unit, r.train.global_batch / unit * unit);
    throw ConfigError(fmt::format(
        "{}: train.global_batch={} is not divisible by train.micro_batch={} x world size {} = "
        "{}; set train.global_batch to a multiple of {} (e.g. {} or {}) or change micro_batch",
        r.source, r.train.global_batch, r.train.micro_batch, world_size, unit, unit, lo,
        lo + unit));
  }
}

namespace {
YAML::Node to_node(const KeySpec& s) {
  YAML::Node n(YAML::NodeType::Map);
  for (const auto& c : s.children) {
    if (c.is_section() && c.children.empty()) continue;  // a component without options
    n[c.name] = c.is_section() ? to_node(c) : c.write();
  }
  return n;
}
}  // namespace

std::string to_yaml(const Recipe& recipe) {
  Recipe copy = recipe;  // the schema binds non-const references
  YAML::Node n = to_node(detail::recipe_schema(copy));
  YAML::Emitter out;
  out.SetOutputCharset(YAML::EmitNonAscii);
  out << n;
  return std::string(out.c_str()) + "\n";
}

uint64_t recipe_hash(const Recipe& recipe) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : to_yaml(recipe)) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {
// Calls fn(path, spec) for every key (leaf) in schema order.
void visit_keys(const KeySpec& s, const std::string& prefix,
                const std::function<void(const std::string&, const KeySpec&)>& fn) {
  for (const auto& c : s.children) {
    std::string p = prefix.empty() ? c.name : prefix + "." + c.name;
    if (c.is_section()) visit_keys(c, p, fn);
    else fn(p, c);
  }
}

std::string flow_text(const KeySpec& key) {
  YAML::Emitter e;
  e.SetOutputCharset(YAML::EmitNonAscii);
  e << YAML::Flow << key.write();
  return e.c_str();
}
}  // namespace

std::vector<std::pair<std::string, std::string>> flatten(const Recipe& recipe) {
  Recipe copy = recipe;
  std::vector<std::pair<std::string, std::string>> out;
  visit_keys(detail::recipe_schema(copy), "",
             [&](const std::string& p, const KeySpec& k) { out.emplace_back(p, flow_text(k)); });
  return out;
}

std::vector<RecipeDifference> recipe_diff(const Recipe& a, const Recipe& b) {
  const auto fa = flatten(a), fb = flatten(b);
  std::map<std::string, std::string> in_b(fb.begin(), fb.end());
  std::set<std::string> in_a;
  std::vector<RecipeDifference> out;
  for (const auto& [key, value] : fa) {
    in_a.insert(key);
    auto it = in_b.find(key);
    const std::string other = it == in_b.end() ? "(absent)" : it->second;
    if (value != other) out.push_back({key, value, other});
  }
  for (const auto& [key, value] : fb)
    if (!in_a.count(key)) out.push_back({key, "(absent)", value});
  return out;
}

namespace {
// Text for a cell of a GitHub-flavoured markdown table: a bare '|' would end the cell (GFM
// reads "\|" as a '|' in the cell, inside code spans too).
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

std::string recipe_reference() {
  Recipe r;
  std::ostringstream os;
  os << "## Paths\n\n"
        "The recipe argument is a file (or NAME.yaml) in the working directory, else a bundled "
        "recipe by name (`mllm-train mini`). `defaults:` entries are relative to the file that "
        "lists them, else to the bundled recipes folder, so a copy of `recipes/mini.yaml` keeps "
        "its `../configs/...` anywhere. Every other relative path is relative to the working "
        "directory: what a run writes (`run.out_dir`, `data.cache_dir`), `plugins`, and "
        "`data.corpus` / `data.sources` files; a corpus path that names no file there is looked "
        "up in the bundled folder next (`<prefix>/share/mllm`; for a build tree, the checkout, "
        "where `launch/fetch-corpus.sh` puts `data/full/`), so a bundled recipe runs from any "
        "folder. `MLLM_SHARE_DIR` names another bundled folder.\n\n"
        "## Keys\n\n";
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  os << "| `defaults` | list of strings | `[]` | recipe files merged first, in order (each with "
        "`defaults:` of its own, e.g. a bundled recipe), then this file on top, the command line "
        "last; maps merge key by key, lists and scalars replace |\n";
  visit_keys(detail::recipe_schema(r), "", [&](const std::string& p, const KeySpec& k) {
    os << "| `" << p << "` | " << cell(k.type) << " | `" << cell(flow_text(k)) << "` | "
       << cell(k.help) << " |\n";
  });
  // Options declared by components (plugins) loaded in this process.
  for (const auto& [id, schema] : all_options()) {
    const auto& [kind, name] = id;
    const std::string section = options_section(kind, name);
    // "model.options" is read when "model.type" names the component; a callback's always.
    const std::string selector = section.substr(0, section.rfind('.') + 1) + "type";
    os << fmt::format("\n### {} `{}`: options under `{}:`{}\n\n", kind, name, section,
                      kind == "callback" ? "" : fmt::format(" (when {} is `{}`)", selector, name));
    os << "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& spec : schema->specs()) {
      OptionValue v = spec.default_value;
      KeySpec k = detail::option_key(spec, v);
      os << "| `" << section << "." << spec.key << "` | " << cell(k.type) << " | `"
         << cell(flow_text(k)) << "` | " << cell(k.help) << " |\n";
    }
  }
  return os.str();
}

}  // namespace mllm
