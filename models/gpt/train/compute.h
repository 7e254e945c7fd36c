// The device the trainer computes on (--device) and the GPT back-end that goes with it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/model/nn_backend.h"
#include "runtime/device/device.h"

namespace strata::tools {

struct Compute {
  std::unique_ptr<device::Device> device;
  std::unique_ptr<gpt::NnBackend> nn;  // nullptr: the host kernels
  std::string name;                    // "host" or "cuda:<ordinal>"
  gpt::Products products = gpt::Products::kF32;
};

// The kind of device `which` ("host", "cuda" or "auto") means here: cuda for "cuda", and for "auto" when
// this build has CUDA and a GPU is visible; host otherwise (MakeCompute reports what is wrong with it).
device::DeviceKind DeviceKindFor(const std::string& which);

// `which`: "host", "cuda", or "auto" (DeviceKindFor). With cuda the GPU is `local_rank` (the launcher's
// when nullopt: env::LauncherLocalRank) modulo the visible GPUs. `matmul` (empty: bf16 when
// `param_dtype` is bf16, else fp32) and `attention` say how the CUDA back-end computes (gpt::NnOptions);
// the host computes in fp32 with the reference attention, so asking it for anything else is an error. A
// bad value, or cuda without a GPU, without the CUDA back-end module or without CUDA in the build, is an
// error naming the reason.
absl::StatusOr<Compute> MakeCompute(const std::string& which, std::optional<gpt::Products> matmul,
                                    gpt::AttentionKind attention, DType param_dtype,
                                    std::optional<int> local_rank = std::nullopt);

}  // namespace strata::tools
