// The device the trainer computes on (--device) and the GPT back-end that goes with it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "examples/gpt/nn_backend.h"
#include "runtime/device/device.h"

namespace strata::tools {

struct Compute {
  std::unique_ptr<device::Device> device;
  std::unique_ptr<gpt::NnBackend> nn;  // nullptr: the host kernels
  std::string name;                    // "host" or "cuda:<ordinal>"
};

// `which`: "host", "cuda", or "auto" (cuda when this build has CUDA and a GPU is visible, else host).
// With cuda the GPU is the launcher's local rank modulo the visible GPUs. `tf32`: fp32 matrix products
// may use TF32 tensor cores. A bad value, or cuda without a GPU or without CUDA in the build, is an error
// naming the reason.
absl::StatusOr<Compute> MakeCompute(const std::string& which, bool tf32);

}  // namespace strata::tools
