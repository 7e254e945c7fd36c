// The memory part of the CUDA back-end module (runtime/base/module.h): the device and registered-host
// tiers of a CUDA engine and the device tier's operations (Note [Tier ops]), made in libstrata_cuda.so
// (cuda_arena_allocator.h, tier_ops_cuda.h) so the core links no libcudart.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"

namespace strata::memory {

struct CudaMemoryApi {
  static constexpr char kPart[] = "memory";
  static constexpr uint32_t kVersion = 2;
  // CudaArenaAllocator::Create(budget_bytes, tracker)
  absl::StatusOr<std::unique_ptr<Allocator>> (*create_arena)(uint64_t budget_bytes, MemoryTracker* tracker);
  // a CudaHostAllocator of `budget_bytes`
  std::unique_ptr<Allocator> (*create_host_allocator)(uint64_t budget_bytes, MemoryTracker* tracker);
  // CreateCudaTierOps(device): the device tier's operations (tier_ops_cuda.h)
  absl::StatusOr<std::unique_ptr<TierOps>> (*create_tier_ops)(device::Device& device);
};

// The module's memory part; FailedPrecondition naming the files tried when the module is absent.
absl::StatusOr<const CudaMemoryApi*> CudaMemoryBackend();

}  // namespace strata::memory
