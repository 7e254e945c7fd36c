// The result of the cuDNN attention calls (models/gpt/nn/cuda/sdpa_cudnn.h): a code and a message, since the
// kernel libraries carry no Abseil (docs/design.md "Layers"). The runtime maps it onto absl::Status at its
// call site; the message already names the failing call, the cuDNN / CUDA status string and, for
// cuDNN, its last-error text, so it can be passed through unchanged.
#pragma once

#include <string>
#include <utility>

namespace strata::kernels::cuda {

enum class SdpaCode {
  kOk,
  kInvalidArgument,    // a caller bug: bad shape, null or misaligned pointer, workspace too small
  kUnsupported,        // valid, but this cuDNN / GPU / shape cannot run it: fall back to the reference kernel
  kResourceExhausted,  // device memory for the context's own workspace
  kCudnnError,         // a cuDNN call failed for another reason
  kCudaError,          // a CUDA runtime call failed
};

const char* SdpaCodeName(SdpaCode code);

struct [[nodiscard]] SdpaStatus {
  SdpaCode code = SdpaCode::kOk;
  std::string message;

  bool ok() const { return code == SdpaCode::kOk; }
  static SdpaStatus Ok() { return {}; }
  static SdpaStatus Error(SdpaCode code, std::string message) { return {code, std::move(message)}; }
  // "kUnsupported: <message>", for logs and test failures.
  std::string ToString() const;
};

}  // namespace strata::kernels::cuda
