// Edit distance and closest-name lookup for error messages.
#include "mllm/core/suggest.h"

#include <algorithm>

#include "mllm/core/registry.h"

namespace mllm {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  if (best_d <= limit) return best;
  // A longer or shorter spelling of the same word ("optimizer" for "optim").
  for (const auto& c : candidates) {
    const auto& shorter = c.size() < word.size() ? c : word;
    const auto& longer = c.size() < word.size() ? word : c;
    if (shorter.size() >= 3 && longer.compare(0, shorter.size(), shorter) == 0) return c;
  }
  return std::string();
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

namespace detail {
std::string unknown_name_message(const std::string& kind, const std::string& name,
                                 const std::vector<std::string>& known) {
  std::string msg = "unknown " + kind + " '" + name + "'";
  std::string hint = closest_match(name, known);
  if (!hint.empty()) msg += " (did you mean '" + hint + "'?)";
  msg += "; known " + kind + " types: " + (known.empty() ? "(none registered)" : join(known));
  return msg;
}
}  // namespace detail

}  // namespace mllm
