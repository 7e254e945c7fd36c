// The entry point of libstrata_cuda.so (runtime/base/module.h): one table per layer over the CUDA
// implementations that stay in their layers' folders (cuda_device.h, cuda_arena_allocator.h, tier_ops_cuda.h,
// nccl_communicator.h, tier_update_cuda.h). Functions whose return type is an implementation's are adapted
// here to the interface the core holds.
#include <cuda_runtime_api.h>

#include <iterator>
#include <memory>

#include "runtime/base/logging.h"
#include "runtime/base/module.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda_backend.h"
#include "runtime/device/cuda_device.h"
#include "runtime/memory/cuda_arena_allocator.h"
#include "runtime/memory/cuda_backend.h"
#include "runtime/memory/tier_ops_cuda.h"
#include "runtime/optim/tier_update_cuda.h"
#if STRATA_WITH_NCCL
#include "runtime/comm/nccl_backend.h"
#include "runtime/comm/nccl_communicator.h"
#endif

namespace strata::cuda_module {
namespace {

absl::StatusOr<int> CurrentOrdinal() {
  int ordinal = 0;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaGetDevice(&ordinal)));
  return ordinal;
}

absl::StatusOr<std::unique_ptr<device::Device>> CreateDevice(int ordinal) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::CudaDevice> d, device::CudaDevice::Create(ordinal));
  return std::unique_ptr<device::Device>(std::move(d));
}

absl::Status HostRegister(void* p, size_t bytes) {
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the sticky-free error so later calls do not report it
  return absl::FailedPreconditionError(cudaGetErrorString(e));
}

void HostUnregister(void* p) { cudaHostUnregister(p); }

absl::StatusOr<std::unique_ptr<memory::Allocator>> CreateArena(uint64_t budget_bytes, memory::MemoryTracker* tracker) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<memory::CudaArenaAllocator> a,
                          memory::CudaArenaAllocator::Create(budget_bytes, tracker));
  return std::unique_ptr<memory::Allocator>(std::move(a));
}

std::unique_ptr<memory::Allocator> CreateHostAllocator(uint64_t budget_bytes, memory::MemoryTracker* tracker) {
  return std::make_unique<memory::CudaHostAllocator>(budget_bytes, tracker);
}

const module::ModuleIdentity kIdentity{module::BuildId(), &SetLogRank};
const device::CudaDeviceApi kDevice{&device::CudaDeviceCount, &CurrentOrdinal, &CreateDevice, &HostRegister,
                                    &HostUnregister};
const memory::CudaMemoryApi kMemory{&CreateArena, &CreateHostAllocator, &memory::CreateCudaTierOps};
const optim::CudaTierUpdateApi kTierUpdate{&optim::CreateCudaTierUpdate};
#if STRATA_WITH_NCCL
const comm::NcclApi kNccl{&comm::AdoptNcclCommunicator, &comm::HostBuffersOverNccl, &comm::CreateNcclFromHost,
                          &comm::CreateNcclFromTorchrun};
#endif

const module::PartEntry kParts[] = {
    {module::ModuleIdentity::kPart, module::ModuleIdentity::kVersion, &kIdentity},
    {device::CudaDeviceApi::kPart, device::CudaDeviceApi::kVersion, &kDevice},
    {memory::CudaMemoryApi::kPart, memory::CudaMemoryApi::kVersion, &kMemory},
    {optim::CudaTierUpdateApi::kPart, optim::CudaTierUpdateApi::kVersion, &kTierUpdate},
#if STRATA_WITH_NCCL
    {comm::NcclApi::kPart, comm::NcclApi::kVersion, &kNccl},
#endif
};

}  // namespace
}  // namespace strata::cuda_module

extern "C" __attribute__((visibility("default"))) const void* strata_cuda_module_part(const char* name,
                                                                                       uint32_t version,
                                                                                       uint32_t* has_version) {
  return strata::module::FindPart(strata::cuda_module::kParts, std::size(strata::cuda_module::kParts), name, version,
                                  has_version);
}
