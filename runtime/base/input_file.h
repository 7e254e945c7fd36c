// Whole-file reads of user-named inputs (configs, token files): the path is checked to be a regular file
// before it is opened, so a directory or a device gives a clear error naming the path instead of an
// empty read, an exception or a crash. Every failure names `what` ("config file") and the path, plus the
// errno text where a system call failed.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

// NotFound / PermissionDenied / InvalidArgument ("... is a directory, not a file") / DataLoss (short read).
absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what);

}  // namespace strata
