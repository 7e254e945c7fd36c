// The NCCL part of the CUDA back-end module (runtime/base/module.h): the NCCL communicators the core
// makes, created in libstrata_cuda.so (nccl_communicator.h) so the core links no libnccl or libcudart.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace strata::comm {

// Each entry is the function of nccl_communicator.h with the same name, with its contract.
struct NcclApi {
  static constexpr char kPart[] = "nccl";
  static constexpr uint32_t kVersion = 1;
  absl::StatusOr<std::unique_ptr<Communicator>> (*adopt)(void* nccl_comm, const Options& options);
  absl::StatusOr<std::unique_ptr<Communicator>> (*host_buffers_over_nccl)(std::unique_ptr<Communicator> nccl);
  absl::StatusOr<std::unique_ptr<Communicator>> (*create_from_host)(Communicator& host, device::Stream& host_stream,
                                                                    const Options& options);
  absl::StatusOr<std::unique_ptr<Communicator>> (*create_from_torchrun)(const TorchrunEnv& env,
                                                                        const Options& options);
};

// The module's NCCL part; FailedPrecondition naming the files tried when the module is absent.
absl::StatusOr<const NcclApi*> NcclBackend();

}  // namespace strata::comm
