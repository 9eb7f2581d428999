// A name -> factory registry for swappable components (models, tokenizers, schedules,
// optimizers, communicators, callbacks). Built-ins register from one register_builtins();
// plugins register from their mllm_register_plugin() entry point (see plugin.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mllm/core/error.h"

namespace mllm {

namespace detail {
// "unknown <kind> 'name'; known: a, b, c" with a did-you-mean hint when one is close.
std::string unknown_name_message(const std::string& kind, const std::string& name,
                                 const std::vector<std::string>& known);
// Who is registering components now: "plugin '<path>'" while load_plugins() runs a plugin's
// entry point (plugin.cpp), "mllm's built-ins" otherwise.
std::string registering_source();
}  // namespace detail

// Registry<Product, Args...>: factories `std::shared_ptr<Product>(Args...)` keyed by name.
// `kind` names the component family in errors ("model", "tokenizer", ...).
template <typename Product, typename... Args>
class Registry {
 public:
  using Factory = std::function<std::shared_ptr<Product>(Args...)>;

  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  // Registers `factory` under `name`. Throws mllm::Error naming both registrants (built-ins or
  // plugin files) if the name is already taken.
  void add(const std::string& name, Factory factory) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string source = detail::registering_source();
    if (auto it = sources_.find(name); it != sources_.end())
      throw Error(kind_ + " '" + name + "' is registered twice, by " + it->second + " and by " +
                  source + "; every " + kind_ + " name must be unique (two copies of one plugin? "
                  "list one of them)");
    factories_.emplace(name, std::move(factory));
    sources_.emplace(name, source);
  }

  bool contains(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    return factories_.count(name) > 0;
  }

  // Throws ConfigError listing the known names (with a did-you-mean) when `name` is unknown.
  void require(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!factories_.count(name))
      throw ConfigError(detail::unknown_name_message(kind_, name, names_locked()));
  }

  // Builds the component registered as `name`. Throws mllm::ConfigError listing the known
  // names when `name` is unknown; whatever the factory throws passes through.
  std::shared_ptr<Product> create(const std::string& name, Args... args) const {
    Factory f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = factories_.find(name);
      if (it == factories_.end())
        throw ConfigError(detail::unknown_name_message(kind_, name, names_locked()));
      f = it->second;
    }
    return f(std::forward<Args>(args)...);
  }

  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    return names_locked();
  }

  const std::string& kind() const { return kind_; }

 private:
  std::vector<std::string> names_locked() const {
    std::vector<std::string> out;
    for (const auto& kv : factories_) out.push_back(kv.first);
    return out;
  }

  std::string kind_;
  mutable std::mutex mu_;  // plugins may register from static initialisers of dlopen'ed libs
  std::map<std::string, Factory> factories_;
  std::map<std::string, std::string> sources_;  // name -> who registered it (registering_source)
};

}  // namespace mllm
