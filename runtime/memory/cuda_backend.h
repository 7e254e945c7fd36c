// The memory part of the CUDA back-end module (runtime/base/module.h): the device and registered-host
// tiers of a CUDA engine, made in libstrata_cuda.so (cuda_arena_allocator.h) so the core links no libcudart.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/memory/memory.h"

namespace strata::memory {

struct CudaMemoryApi {
  static constexpr char kPart[] = "memory";
  static constexpr uint32_t kVersion = 1;
  // CudaArenaAllocator::Create(budget_bytes, tracker)
  absl::StatusOr<std::unique_ptr<Allocator>> (*create_arena)(uint64_t budget_bytes, MemoryTracker* tracker);
  // a CudaHostAllocator of `budget_bytes`
  std::unique_ptr<Allocator> (*create_host_allocator)(uint64_t budget_bytes, MemoryTracker* tracker);
};

// The module's memory part; FailedPrecondition naming the files tried when the module is absent.
absl::StatusOr<const CudaMemoryApi*> CudaMemoryBackend();

}  // namespace strata::memory
