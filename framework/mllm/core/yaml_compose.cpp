// Recipe composition: defaults: includes with cycle detection, deep merge, CLI overrides, and a
// key-path -> source-location map.
#include "mllm/core/yaml_compose.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace fs = std::filesystem;

namespace mllm {

std::string SourceLocation::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

SourceLocation ComposedYaml::locate(const std::string& path) const {
  std::string p = path;
  while (true) {
    auto it = where.find(p);
    if (it != where.end()) return it->second;
    auto dot = p.rfind('.');
    if (dot == std::string::npos) break;
    p = p.substr(0, dot);
  }
  return files.empty() ? SourceLocation{"<recipe>"} : SourceLocation{files.back()};
}

namespace {

SourceLocation loc_of(const std::string& file, const YAML::Node& n) {
  YAML::Mark m = n.Mark();
  if (m.is_null()) return {file, 0, 0};
  return {file, m.line + 1, m.column + 1};
}

// Records the location of `n` (and, for maps, every key below it) under `path`.
void record(ComposedYaml& out, const std::string& path, const std::string& file,
            const YAML::Node& n) {
  out.where[path] = loc_of(file, n);
  if (n.IsMap()) {
    for (const auto& kv : n) {
      std::string key = kv.first.as<std::string>();
      std::string sub = path.empty() ? key : path + "." + key;
      out.where[sub] = loc_of(file, kv.first);
      if (kv.second.IsMap()) record(out, sub, file, kv.second);
    }
  }
}

// Deep-merges `top` onto `base` (maps key by key; everything else replaces).
void merge_into(YAML::Node base, const YAML::Node& top, ComposedYaml& out, const std::string& path,
                const std::string& file) {
  for (const auto& kv : top) {
    std::string key = kv.first.as<std::string>();
    std::string sub = path.empty() ? key : path + "." + key;
    YAML::Node existing = base[key];
    if (existing.IsDefined() && existing.IsMap() && kv.second.IsMap()) {
      out.where[sub] = loc_of(file, kv.first);
      merge_into(existing, kv.second, out, sub, file);
    } else {
      base[key] = YAML::Clone(kv.second);
      // Drop stale locations of keys below a replaced value.
      for (auto it = out.where.lower_bound(sub + "."); it != out.where.end() &&
                                                       it->first.rfind(sub + ".", 0) == 0;)
        it = out.where.erase(it);
      out.where[sub] = loc_of(file, kv.first);
      if (kv.second.IsMap()) record(out, sub, file, kv.second);
    }
  }
}

// Throws ConfigError naming the key path and both lines when a mapping in `n` holds a key twice
// (`lr` twice under `optim:`, two `optim:` sections, `{a: 1, a: 2}`). YAML 1.2 requires keys to
// be unique; yaml-cpp keeps both and a lookup would silently see only one of them.
void check_unique_keys(const YAML::Node& n, const std::string& name, const std::string& path) {
  if (n.IsSequence()) {
    for (std::size_t i = 0; i < n.size(); ++i)
      check_unique_keys(n[i], name, path + "[" + std::to_string(i) + "]");
    return;
  }
  if (!n.IsMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : n) {
    if (!kv.first.IsScalar()) continue;
    const std::string key = kv.first.Scalar();
    const std::string sub = path.empty() ? key : path + "." + key;
    const auto [it, fresh] = seen.emplace(key, kv.first.Mark());
    if (!fresh)
      throw ConfigError(fmt::format("{}:{}:{}: {}: duplicate key (first given on line {}); a key "
                                    "may appear once per mapping: remove or merge one of them",
                                    name, kv.first.Mark().line + 1, kv.first.Mark().column + 1,
                                    sub, it->second.line + 1));
    check_unique_keys(kv.second, name, sub);
  }
}

YAML::Node parse_text(const std::string& text, const std::string& name) {
  try {
    YAML::Node n = YAML::Load(text);
    check_unique_keys(n, name, "");
    if (n.IsNull()) return YAML::Node(YAML::NodeType::Map);
    if (!n.IsMap())
      throw ConfigError(name + ": a recipe must be a YAML mapping of sections (run:, data:, "
                        "model:, ...), got a " + (n.IsSequence() ? "list" : "scalar"));
    return n;
  } catch (const YAML::Exception& e) {
    throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
}

std::string read_file(const std::string& path, const std::string& included_from,
                      const std::string& also_tried = "") {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError("cannot read recipe file '" + path + "'" +
                      (included_from.empty() ? "" : " (listed in defaults: of " + included_from + ")") +
                      ": " + (fs::exists(path) ? "permission denied or not a file" : "no such file") +
                      (also_tried.empty() ? "" : ", nor '" + also_tried + "' (the bundled recipes folder)"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void compose_node(const YAML::Node& doc, const std::string& name, const fs::path& base_dir,
                  const fs::path& fallback_dir, std::vector<std::string>& stack, ComposedYaml& out) {
  YAML::Node defaults = doc["defaults"];
  if (defaults.IsDefined() && !defaults.IsNull()) {
    if (!defaults.IsSequence() && !defaults.IsScalar())
      throw ConfigError(loc_of(name, defaults).str() +
                        ": defaults: must be a list of recipe files, e.g. [../configs/model/minillm-tiny.yaml]");
    std::vector<std::string> items;
    if (defaults.IsScalar()) items.push_back(defaults.as<std::string>());
    else
      for (const auto& d : defaults) {
        if (!d.IsScalar())
          throw ConfigError(loc_of(name, d).str() + ": each defaults: entry must be a file path");
        items.push_back(d.as<std::string>());
      }
    for (const auto& item : items) {
      fs::path p = fs::path(item).is_absolute() ? fs::path(item) : base_dir / item;
      // Not next to the file that lists it: the bundled recipes folder's (a copy of a bundled
      // recipe keeps its `../configs/...`).
      std::string also_tried;
      std::error_code ec;
      if (!fs::path(item).is_absolute() && !fallback_dir.empty() && !fs::exists(p, ec)) {
        const fs::path q = fallback_dir / item;
        if (fs::exists(q, ec)) p = q;
        else also_tried = q.lexically_normal().string();
      }
      std::string canon = fs::weakly_canonical(p).string();
      for (const auto& s : stack)
        if (s == canon) {
          std::string chain;
          for (const auto& c : stack) chain += c + " -> ";
          throw ConfigError(loc_of(name, defaults).str() + ": include cycle: " + chain + canon);
        }
      std::string text = read_file(p.string(), name, also_tried);
      YAML::Node sub = parse_text(text, p.string());
      stack.push_back(canon);
      compose_node(sub, p.string(), p.parent_path(), fallback_dir, stack, out);
      stack.pop_back();
      out.files.push_back(p.string());
    }
  }
  YAML::Node body(YAML::NodeType::Map);
  for (const auto& kv : doc)
    if (kv.first.as<std::string>() != "defaults") body[kv.first] = kv.second;
  merge_into(out.root, body, out, "", name);
}

void apply_override(const std::string& ov, std::size_t index, ComposedYaml& out) {
  const std::string where = "<command line> override #" + std::to_string(index + 1) + " '" + ov + "'";
  auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(where + ": expected key.path=value, e.g. optim.lr=3e-4");
  std::string key = ov.substr(0, eq);
  std::string value = ov.substr(eq + 1);
  YAML::Node v;
  try {
    v = value.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(where + ": value is not valid YAML: " + e.msg);
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) throw ConfigError(where + ": empty component in key path '" + key + "'");
    parts.push_back(part);
  }
  // Build {a: {b: {c: value}}} and merge it like a file on top. (No Node::operator= between
  // existing nodes here: in yaml-cpp it rebinds shared data instead of the handle.)
  YAML::Node top = v;
  for (std::size_t i = parts.size(); i-- > 0;) {
    YAML::Node wrap(YAML::NodeType::Map);
    wrap[parts[i]] = top;
    top.reset(wrap);
  }
  // merge_into records marks of the synthetic nodes; replace them with the override's name.
  merge_into(out.root, top, out, "", "<command line>");
  SourceLocation cli{"<command line> " + ov, 0, 0};
  std::string p;
  for (const auto& part : parts) {
    p = p.empty() ? part : p + "." + part;
    out.where[p] = cli;
  }
  for (auto it = out.where.lower_bound(key + "."); it != out.where.end() && it->first.rfind(key + ".", 0) == 0; ++it)
    it->second = cli;
}

}  // namespace

ComposedYaml compose_yaml_string(const std::string& text, const std::string& name,
                                 const std::string& base_dir,
                                 const std::vector<std::string>& overrides,
                                 const std::string& fallback_dir) {
  ComposedYaml out;
  out.root = YAML::Node(YAML::NodeType::Map);
  YAML::Node doc = parse_text(text, name);
  std::vector<std::string> stack{fs::weakly_canonical(fs::path(name)).string()};
  compose_node(doc, name, fs::path(base_dir), fs::path(fallback_dir), stack, out);
  out.files.push_back(name);
  for (std::size_t i = 0; i < overrides.size(); ++i) apply_override(overrides[i], i, out);
  return out;
}

ComposedYaml compose_yaml(const std::string& path, const std::vector<std::string>& overrides,
                          const std::string& fallback_dir) {
  std::string text = read_file(path, "");
  return compose_yaml_string(text, path, fs::path(path).parent_path().string(), overrides,
                             fallback_dir);
}

}  // namespace mllm
