// "Did you mean": the closest candidate to a misspelt key or flag.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace strata {

// Levenshtein distance.
size_t EditDistance(absl::string_view a, absl::string_view b);

// The candidate nearest to `key` when it is close enough to be a typo (distance at most a third of the
// key's length, at least 2, and less than the whole key); nullopt otherwise. Case-insensitive.
std::optional<std::string> NearestMatch(absl::string_view key, const std::vector<std::string>& candidates);

}  // namespace strata
