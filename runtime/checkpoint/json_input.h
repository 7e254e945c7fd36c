// Reading JSON that came from outside (a checkpoint manifest, a shard header, a trainer state): the
// nesting depth is bounded before the parser sees the text (nlohmann's parser is iterative, but dump(),
// copies and comparisons recurse, so a deep document would overflow the stack later), and every field is
// read through a typed accessor that checks presence, type and range and names the field on failure.
// Nothing here throws or aborts, whatever the input: nlohmann's get<>() is never called on a value whose
// type has not been checked.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "runtime/base/json_text.h"

namespace strata::checkpoint {

// The nesting depth allowed in a manifest or shard header is strata::kMaxJsonDepth (64; the format itself
// uses 6), checked by strata::CheckJsonNesting (runtime/base/json_text.h) before the parser runs.

// CheckJsonNesting, then parse; not JSON is DataLoss naming `what`.
absl::StatusOr<nlohmann::json> ParseUntrustedJson(absl::string_view text, absl::string_view what,
                                                  int max_depth = kMaxJsonDepth);

// Typed reads of `obj[key]`. `where` names the document, `field` the path of the field ("units[2].name");
// a missing field, a wrong type or a value out of [lo, hi] is DataLoss naming both.
class JsonReader {
 public:
  explicit JsonReader(std::string where) : where_(std::move(where)) {}
  absl::StatusOr<int64_t> Int(const nlohmann::json& obj, const char* key, const std::string& field, int64_t lo,
                              int64_t hi) const;
  absl::StatusOr<uint64_t> Uint(const nlohmann::json& obj, const char* key, const std::string& field,
                                uint64_t hi = UINT64_MAX) const;
  absl::StatusOr<std::string> Str(const nlohmann::json& obj, const char* key, const std::string& field) const;
  absl::StatusOr<bool> Bool(const nlohmann::json& obj, const char* key, const std::string& field) const;
  // A finite number (integer or floating point).
  absl::StatusOr<double> Number(const nlohmann::json& obj, const char* key, const std::string& field) const;
  // An array field: the array itself.
  absl::StatusOr<const nlohmann::json*> Array(const nlohmann::json& obj, const char* key,
                                              const std::string& field) const;
  // Exactly eight hex digits, as checksums are written.
  absl::StatusOr<uint32_t> Hex32(const nlohmann::json& obj, const char* key, const std::string& field) const;
  // An element of an array that must be an object.
  absl::Status IsObject(const nlohmann::json& v, const std::string& field) const;
  // DataLoss "<where>: field '<field>' <what>".
  absl::Status Bad(const std::string& field, absl::string_view what) const;

 private:
  absl::StatusOr<const nlohmann::json*> Get(const nlohmann::json& obj, const char* key, const std::string& field) const;
  std::string where_;
};

// "units[3]"
std::string Index(absl::string_view field, size_t i);

}  // namespace strata::checkpoint
