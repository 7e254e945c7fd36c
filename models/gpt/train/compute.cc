#include "models/gpt/train/compute.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/env.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/device/cuda_backend.h"

namespace strata::tools {

device::DeviceKind DeviceKindFor(const std::string& which) {
#if STRATA_WITH_CUDA
  if (which == "auto" && device::CudaDeviceCountIfAvailable() > 0) return device::DeviceKind::kCuda;
#endif
  return which == "cuda" ? device::DeviceKind::kCuda : device::DeviceKind::kHost;
}

absl::StatusOr<Compute> MakeCompute(const std::string& which, std::optional<gpt::Products> matmul,
                                    gpt::AttentionKind attention, DType param_dtype, std::optional<int> local_rank) {
  if (which != "host" && which != "cuda" && which != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--device '", which, "': use cuda, host or auto"));
  }
  gpt::NnOptions nn;
  nn.products = matmul.value_or(param_dtype == DType::kBF16 ? gpt::Products::kBf16 : gpt::Products::kF32);
  nn.attention = attention;
  Compute c;
#if STRATA_WITH_CUDA
  // The CUDA device comes from the CUDA back-end module (runtime/base/module.h); without it, "cuda" says
  // which files were tried and "auto" means the host.
  absl::StatusOr<const device::CudaDeviceApi*> cuda = device::CudaDeviceBackend();
  if (which == "cuda" && !cuda.ok()) return Annotate(cuda.status(), "--device cuda");
  const int gpus = cuda.ok() ? (*cuda)->device_count() : 0;
  if (which == "cuda" && gpus == 0) {
    return absl::FailedPreconditionError("--device cuda: no CUDA device is visible (check nvidia-smi and "
                                         "CUDA_VISIBLE_DEVICES), or use --device host");
  }
  if (DeviceKindFor(which) == device::DeviceKind::kCuda) {
    const int ordinal = local_rank.value_or(env::LauncherLocalRank().value_or(0)) % gpus;
    STRATA_ASSIGN_OR_RETURN(c.device, (*cuda)->create(ordinal));
    STRATA_ASSIGN_OR_RETURN(c.nn, gpt::MakeCudaNn(nn));
    c.name = absl::StrCat("cuda:", ordinal);
    c.products = nn.products;
    return c;
  }
#else
  if (which == "cuda") {
    return absl::UnimplementedError("--device cuda: this strata was built without CUDA; use --device host");
  }
#endif
  // The host computes in fp32 with the reference attention.
  if (matmul.has_value() && *matmul != gpt::Products::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("--matmul ", gpt::ProductsName(*matmul),
                                                   " needs --device cuda (the host multiplies in fp32)"));
  }
  if (attention == gpt::AttentionKind::kFused) {
    return absl::InvalidArgumentError("--attention fused needs --device cuda (cuDNN); the host runs the reference");
  }
  c.device = std::make_unique<device::HostDevice>();
  c.name = "host";
  return c;
}

}  // namespace strata::tools
