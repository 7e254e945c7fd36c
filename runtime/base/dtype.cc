#include "runtime/base/dtype.h"

#include "absl/strings/str_cat.h"

namespace strata {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kF16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "' (use fp32, bf16 or fp16)"));
}

}  // namespace strata
