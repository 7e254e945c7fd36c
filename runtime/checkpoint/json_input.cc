#include "runtime/checkpoint/json_input.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::checkpoint {

using nlohmann::json;

absl::StatusOr<json> ParseUntrustedJson(absl::string_view text, absl::string_view what, int max_depth) {
  STRATA_RETURN_IF_ERROR(CheckJsonNesting(std::string_view(text.data(), text.size()), max_depth,
                                          std::string_view(what.data(), what.size())));
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat(what, " is not valid JSON"));
  return j;
}

std::string Index(absl::string_view field, size_t i) { return absl::StrCat(field, "[", i, "]"); }

absl::Status JsonReader::Bad(const std::string& field, absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(where_, ": field '", field, "' ", what));
}

absl::Status JsonReader::IsObject(const json& v, const std::string& field) const {
  if (!v.is_object()) return Bad(field, absl::StrCat("must be an object (got ", v.type_name(), ")"));
  return absl::OkStatus();
}

absl::StatusOr<const json*> JsonReader::Get(const json& obj, const char* key, const std::string& field) const {
  if (!obj.is_object()) return Bad(field, "belongs to a value that is not an object");
  const auto it = obj.find(key);
  if (it == obj.end()) return Bad(field, "is missing");
  return &*it;
}

absl::StatusOr<int64_t> JsonReader::Int(const json& obj, const char* key, const std::string& field, int64_t lo,
                                        int64_t hi) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  const auto range = [&] { return absl::StrCat("must be an integer in [", lo, ", ", hi, "]"); };
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    // A parsed non-negative number is unsigned, so the lower bound is checked here too (0 below lo >= 1).
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      return Bad(field, absl::StrCat(range(), " (got ", u, ")"));
    }
    return static_cast<int64_t>(u);
  }
  if (!v->is_number_integer()) return Bad(field, absl::StrCat(range(), " (got ", v->type_name(), ")"));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return Bad(field, absl::StrCat(range(), " (got ", x, ")"));
  return x;
}

absl::StatusOr<uint64_t> JsonReader::Uint(const json& obj, const char* key, const std::string& field,
                                          uint64_t hi) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  if (!v->is_number_unsigned()) {
    const std::string got = v->is_number_integer() ? absl::StrCat(v->get<int64_t>()) : std::string(v->type_name());
    return Bad(field, absl::StrCat("must be an unsigned integer (got ", got, ")"));
  }
  const uint64_t u = v->get<uint64_t>();
  if (u > hi) return Bad(field, absl::StrCat("must be at most ", hi, " (got ", u, ")"));
  return u;
}

absl::StatusOr<std::string> JsonReader::Str(const json& obj, const char* key, const std::string& field) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  if (!v->is_string()) return Bad(field, absl::StrCat("must be a string (got ", v->type_name(), ")"));
  return v->get<std::string>();
}

absl::StatusOr<bool> JsonReader::Bool(const json& obj, const char* key, const std::string& field) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  if (!v->is_boolean()) return Bad(field, absl::StrCat("must be true or false (got ", v->type_name(), ")"));
  return v->get<bool>();
}

absl::StatusOr<double> JsonReader::Number(const json& obj, const char* key, const std::string& field) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  if (!v->is_number()) return Bad(field, absl::StrCat("must be a number (got ", v->type_name(), ")"));
  const double x = v->get<double>();
  if (!std::isfinite(x)) return Bad(field, "must be finite");
  return x;
}

absl::StatusOr<const json*> JsonReader::Array(const json& obj, const char* key, const std::string& field) const {
  STRATA_ASSIGN_OR_RETURN(const json* v, Get(obj, key, field));
  if (!v->is_array()) return Bad(field, absl::StrCat("must be an array (got ", v->type_name(), ")"));
  return v;
}

absl::StatusOr<uint32_t> JsonReader::Hex32(const json& obj, const char* key, const std::string& field) const {
  STRATA_ASSIGN_OR_RETURN(std::string s, Str(obj, key, field));
  if (s.size() != 8) return Bad(field, "must be 8 hex digits");
  uint32_t x = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return Bad(field, "must be 8 hex digits");
    }
    x = x << 4 | static_cast<uint32_t>(d);
  }
  return x;
}

}  // namespace strata::checkpoint
