// Composition of a YAML recipe from its `defaults:` includes, the file itself and command-line
// overrides `key.path=value`, keeping for every key the place (file:line:col) it came from so
// that validation errors can point at it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace mllm {

// Where a value came from: a file position, or a command-line override.
struct SourceLocation {
  std::string file;  // recipe file path, or "<command line>"
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown
  std::string str() const;  // "file:line:col" (or just "file")
};

// The merged recipe tree plus the origin of every key path ("optim.lr", "data.tokenizer.type").
struct ComposedYaml {
  YAML::Node root;                                 // a map; `defaults` removed
  std::map<std::string, SourceLocation> where;     // key path -> where its value was set
  std::vector<std::string> files;                  // every file read, includes first
  SourceLocation locate(const std::string& path) const;  // nearest known parent if absent
};

// Loads `path`, merging its `defaults:` (paths relative to the including file, nested,
// merged in order, the including file on top; maps merge key by key, scalars and lists
// replace), then applies `overrides` ("a.b.c=value", value parsed as YAML: `3e-4`, `true`,
// `[a,b]`). A relative `defaults:` entry with no file next to the including file is taken
// from `fallback_dir` when it has one (load_recipe: the bundled recipes folder). Throws
// ConfigError for a missing/unreadable file (naming both places tried), a YAML syntax error
// (file:line:col), an include cycle (the chain), a non-map document, or a malformed override.
ComposedYaml compose_yaml(const std::string& path, const std::vector<std::string>& overrides,
                          const std::string& fallback_dir = "");

// Same, from an in-memory YAML text (includes resolved relative to `base_dir`).
ComposedYaml compose_yaml_string(const std::string& text, const std::string& name,
                                 const std::string& base_dir,
                                 const std::vector<std::string>& overrides,
                                 const std::string& fallback_dir = "");

}  // namespace mllm
