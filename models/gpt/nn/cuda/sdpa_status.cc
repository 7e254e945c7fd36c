// SdpaStatus names (sdpa_status.h).
#include "models/gpt/nn/cuda/sdpa_status.h"

#include <cstddef>
#include <iterator>

namespace strata::kernels::cuda {

const char* SdpaCodeName(SdpaCode code) {
  // In SdpaCode's order.
  static constexpr const char* kNames[] = {"kOk",         "kInvalidArgument", "kUnsupported", "kResourceExhausted",
                                           "kCudnnError", "kCudaError"};
  const auto i = static_cast<size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "unknown SdpaCode";
}

std::string SdpaStatus::ToString() const {
  return ok() ? std::string("kOk") : std::string(SdpaCodeName(code)) + ": " + message;
}

}  // namespace strata::kernels::cuda
