// JSON text from outside the process (configs, safetensors headers): parsed in one guarded pass.
//
// Guarantees, checked before anything is trusted:
//  - nesting: objects and arrays deeper than `max_depth` are refused by a linear scan before the parser
//    runs, so a hostile 100k-deep document costs one pass over its bytes, never deep recursion or a DOM;
//  - duplicate keys: nlohmann keeps the last of two equal keys silently; here the first repeated key is
//    an error naming its path ("optimizer.params.lr"). The finder keeps each open object's keys and the
//    names of the open containers only, so its memory is linear in the input at any depth;
//  - syntax: nlohmann's message (line and column), without its exception prefix.
// Never throws and never aborts, whatever the bytes. Every error is InvalidArgument and names `what`
// ("config", "safetensors header").
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

inline constexpr int kMaxJsonDepth = 64;

// OK unless `text` opens more than `max_depth` nested objects/arrays (brackets inside strings do not count).
absl::Status CheckJsonNesting(std::string_view text, int max_depth, std::string_view what);

// Parses `text` with the guards above. Messages: "malformed <what> JSON: ...", "duplicate <what> key 'a.b'",
// "<what> JSON nests deeper than <max_depth> levels (at byte N)".
absl::StatusOr<nlohmann::json> ParseGuardedJson(std::string_view text, std::string_view what,
                                                int max_depth = kMaxJsonDepth);

}  // namespace strata
