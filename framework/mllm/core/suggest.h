// "Did you mean ...?" hints for unknown names: the closest candidate by edit distance.
#pragma once

#include <string>
#include <vector>

namespace mllm {

// Levenshtein distance between a and b (bytes, unit costs).
std::size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word` if it is close enough to be a plausible typo (distance at most
// max(2, len/3)) or one is a prefix (>= 3 chars) of the other, else "". Ties go to the
// earlier candidate.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// Joins strings with ", ".
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace mllm
