// Property helpers for the JSON-header parsers: an accepted number must be the document's number exactly.
// nlohmann's get<int>() / get<uint64_t>() narrow silently (4294967297 -> 1, -1 -> 2^64 - 1, 1.5 -> 1), so a
// parser that trusts them accepts a different value than the file says.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "tests/fuzz/fuzz_file.h"

namespace strata::fuzz {

// True when `v` is a JSON number whose value is exactly `parsed`.
template <typename T>
bool SameNumber(const nlohmann::json& v, T parsed) {
  static_assert(std::is_integral_v<T>);
  if (v.is_number_unsigned()) {
    return parsed >= 0 && static_cast<uint64_t>(parsed) == v.get<uint64_t>();
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return std::is_signed_v<T> && static_cast<int64_t>(parsed) == i;
    return parsed >= 0 && static_cast<uint64_t>(parsed) == static_cast<uint64_t>(i);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && std::trunc(d) == d && d == static_cast<double>(parsed);
  }
  return false;
}

// Checks the field `key` of object `obj` against the parsed value; `what` names it in the failure.
template <typename T>
void ExpectExact(const nlohmann::json& obj, const char* key, T parsed, const std::string& what) {
  const auto it = obj.find(key);
  STRATA_FUZZ_EXPECT(
      it != obj.end() && SameNumber(*it, parsed), "accepted %s.%s = %lld, but the document says %s", what.c_str(), key,
      static_cast<long long>(parsed),
      it == obj.end() ? "nothing" : it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// A CRC-32 written as hex text (the writers print "%08x"): the parsed value must be that of a text of one
// to eight hex digits and nothing else. std::stoul also takes "-1" (wrapped), nine or more digits
// (truncated by the cast), and stops at the first non-digit ("2%3f" reads as 2).
inline void ExpectExactHex32(const nlohmann::json& obj, const char* key, uint32_t parsed, const std::string& what) {
  const std::string text = obj.at(key).get<std::string>();
  bool ok = !text.empty() && text.size() <= 8;
  uint32_t value = 0;
  for (char c : text) {
    const int d = c >= '0' && c <= '9' ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    ok = ok && d >= 0;
    value = value * 16 + static_cast<uint32_t>(d < 0 ? 0 : d);
  }
  ok = ok && value == parsed;
  STRATA_FUZZ_EXPECT(ok, "accepted %s.%s = %08x from the text '%s'", what.c_str(), key, parsed, text.c_str());
}

}  // namespace strata::fuzz
