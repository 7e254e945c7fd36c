// Element types of flat buffers.
#pragma once

#include <cstddef>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace strata {

enum class DType { kF32, kBF16, kF16 };

constexpr size_t DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }
absl::string_view DTypeName(DType t);  // "fp32", "bf16", "fp16"
absl::StatusOr<DType> ParseDType(absl::string_view name);  // accepts fp32|float32|bf16|bfloat16|fp16|float16

}  // namespace strata
