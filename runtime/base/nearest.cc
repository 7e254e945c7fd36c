#include "runtime/base/nearest.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"

namespace strata {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<std::string> NearestMatch(absl::string_view key, const std::vector<std::string>& candidates) {
  const std::string lower = absl::AsciiStrToLower(key);
  const std::string* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(lower, absl::AsciiStrToLower(c));
    if (d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  const bool close =
      best != nullptr && best_distance < key.size() && best_distance <= std::max<size_t>(2, key.size() / 3);
  if (!close) return std::nullopt;
  return *best;
}

}  // namespace strata
