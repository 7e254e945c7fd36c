// Config overrides ("a.b.c=value", as strata train's flags and --set give them), applied to the JSON document
// before validation. Internal to runtime/engine (ParseConfigWithOverrides).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"

namespace strata::engine {

// Sets one "a.b.c=value" override in `doc`, creating objects along the path. Text that is not JSON is a string
// value; JSON is parsed with the config file's guards (nesting, duplicate keys). InvalidArgument naming the
// override when its form is wrong or the path runs through a value that is not an object.
absl::Status ApplyConfigOverride(const std::string& override_text, nlohmann::json* doc);

}  // namespace strata::engine
