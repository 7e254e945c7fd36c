// Byte quantities: parsing "512MiB", "1.5GB", "4096" and printing them back.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace strata {

// Accepts an integer or decimal number with an optional suffix: B, KiB, MiB, GiB, TiB (powers of 1024)
// or KB, MB, GB, TB (powers of 1000); case-insensitive. Errors name the text.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// "1.50 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);

constexpr uint64_t RoundUp(uint64_t x, uint64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace strata
