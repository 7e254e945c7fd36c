// Whole-file reads of user-named inputs (configs, token files): the path is checked to be a regular file
// (or, where the caller allows it, a FIFO) before it is opened, so a directory, a device (/dev/zero) or a
// FIFO with no writer gives a clear error naming the path instead of an empty read, a hang, an abort on
// allocation or a crash. Every read has an explicit byte cap: a regular file larger than the cap is refused
// from its size before anything is allocated, and a FIFO is refused as soon as it yields more than the cap.
// Every failure names `what` ("config file") and the path, plus the errno text where a system call failed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

// Configs and the small JSON files read like them: far above any real config, far below memory.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{64} << 20;

// Token (data) files: a fixed 64 GiB, lowered to an eighth of physical memory where that is smaller,
// because plain text decodes to one int32 token per byte (the bytes plus four times them in memory).
uint64_t MaxTokenFileBytes();

enum class InputKind {
  kRegularFile,        // only a regular file (configs: a FIFO or device is refused)
  kRegularFileOrFifo,  // also a FIFO / pipe (`--data <(zcat corpus.gz)`), read with the cap enforced as it flows
};

// NotFound / PermissionDenied / InvalidArgument ("... is a directory, not a file", "... is not a regular
// file", "... is N bytes, above the limit of M bytes") / DataLoss (read error).
absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what, uint64_t max_bytes,
                                          InputKind kind = InputKind::kRegularFile);

// A config file: a regular file of at most kMaxConfigFileBytes holding more than white space (an empty
// file is refused as "config file 'P' is empty": it is a mistake, not a request for the defaults).
absl::StatusOr<std::string> ReadConfigFile(const std::string& path);

}  // namespace strata
