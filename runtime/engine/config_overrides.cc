// `strata train --config FILE key.path=value ...`: one override applied to the config's JSON document.
#include "runtime/engine/config_overrides.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/json_text.h"
#include "runtime/base/status.h"

namespace strata::engine {

absl::Status ApplyConfigOverride(const std::string& override_text, nlohmann::json* doc) {
  using json = nlohmann::json;
  const auto join = [](const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : absl::StrCat(prefix, ".", key);
  };
  const size_t eq = override_text.find('=');
  const std::vector<std::string> parts =
      absl::StrSplit(override_text.substr(0, eq == std::string::npos ? 0 : eq), '.');
  const bool bad_path =
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); });
  if (eq == std::string::npos || bad_path) {
    return absl::InvalidArgumentError(
        absl::StrCat("config override '", override_text, "' is not of the form key.path=value"));
  }
  if (parts.size() > static_cast<size_t>(kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat("config override '", override_text.substr(0, 80),
                                                   "...': its key path has ", parts.size(), " parts; at most ",
                                                   kMaxJsonDepth));
  }
  json* node = doc;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path = join(path, parts[i]);
    json& child = (*node)[parts[i]];
    if (child.is_null()) child = json::object();
    if (!child.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("config override '", override_text, "': '", path,
                                                     "' is a ", child.type_name(), ", not an object"));
    }
    node = &child;
  }
  const std::string value = override_text.substr(eq + 1);
  // Text that is not JSON is a string value; JSON is parsed with the same guards as a config file.
  STRATA_RETURN_IF_ERROR(CheckJsonNesting(value, kMaxJsonDepth, "config override"));
  if (!json::accept(value)) {
    (*node)[parts.back()] = json(value);
    return absl::OkStatus();
  }
  absl::StatusOr<json> parsed = ParseGuardedJson(value, "config override");
  if (!parsed.ok())
    return Annotate(parsed.status(), absl::StrCat("config override of '", join(path, parts.back()), "'"));
  (*node)[parts.back()] = *std::move(parsed);
  return absl::OkStatus();
}

}  // namespace strata::engine
