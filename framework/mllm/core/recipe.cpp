// Recipe loading: walks the composed YAML tree against the key table, reports unknown,
// misplaced and mistyped keys with their source location, then checks cross-field rules.
#include "mllm/core/recipe.h"

#include <functional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "mllm/core/error.h"
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
  return msg;
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
    try {
      spec->read(kv.second);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("{}: {}: {} ({}: {})", composed.locate(path).str(), path,
                                    e.what(), spec->type, spec->help));
    }
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
  if (r.data.corpus.empty())
    fail("data.corpus", "no corpus given; list .txt or .jsonl files or globs, e.g. "
                        "[data/tang300/*.jsonl]");
}

Recipe build(const ComposedYaml& composed, const std::string& source) {
  Recipe r;
  KeySpec root = detail::recipe_schema(r);
  read_section(root, root, composed.root, "", composed);
  validate(r, composed);
  r.source = source;
  return r;
}

}  // namespace

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  return build(compose_yaml(path, overrides), path);
}

Recipe load_recipe_string(const std::string& yaml, const std::string& name,
                          const std::vector<std::string>& overrides, const std::string& base_dir) {
  return build(compose_yaml_string(yaml, name, base_dir, overrides), name);
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
  for (const auto& c : s.children) n[c.name] = c.is_section() ? to_node(c) : c.write();
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
  auto fa = flatten(a), fb = flatten(b);
  std::vector<RecipeDifference> out;
  for (std::size_t i = 0; i < fa.size(); ++i)
    if (fa[i].second != fb[i].second) out.push_back({fa[i].first, fa[i].second, fb[i].second});
  return out;
}

std::string recipe_reference() {
  Recipe r;
  std::ostringstream os;
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  visit_keys(detail::recipe_schema(r), "", [&](const std::string& p, const KeySpec& k) {
    os << "| `" << p << "` | " << k.type << " | `" << flow_text(k) << "` | " << k.help << " |\n";
  });
  return os.str();
}

}  // namespace mllm
