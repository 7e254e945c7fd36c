#include "runtime/base/units.h"

#include <cctype>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata {

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < s.size() && (std::isdigit(static_cast<unsigned char>(s[split])) || s[split] == '.')) ++split;
  const std::string number(s.substr(0, split));
  const std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(split)));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a byte size (examples: 4096, 512MiB, 2GB)"));
  }
  static const std::pair<const char*, double> kSuffixes[] = {
      {"", 1}, {"b", 1}, {"k", 1024.0}, {"kib", 1024.0}, {"m", 1048576.0}, {"mib", 1048576.0},
      {"g", 1073741824.0}, {"gib", 1073741824.0}, {"t", 1099511627776.0}, {"tib", 1099511627776.0},
      {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}};
  for (const auto& [name, mult] : kSuffixes) {
    if (suffix == name) {
      // Round in double and convert directly: std::llround would overflow its signed result above
      // 2^63 bytes. 2^64 itself is the first value that does not fit.
      const double bytes = std::round(value * mult);
      if (bytes >= 18446744073709551616.0) {
        return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large (more than 2^64 - 1 bytes)"));
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' has an unknown unit '", suffix, "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.2f %s", v, kUnits[u]);
}

}  // namespace strata
