// The device tier on CUDA builds: one cudaMalloc of the whole budget, sub-allocated by an Arena (never
// managed memory or a caching allocator: docs/design.md "Memory is a contract"). Fresh blocks are zeroed with
// cudaMemset. Built only with STRATA_WITH_CUDA, into the CUDA back-end module (the core reaches it
// through cuda_backend.h).
#pragma once

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "runtime/memory/arena.h"
#include "runtime/memory/memory.h"

namespace strata::memory {

// The device tier on CUDA builds: one cudaMalloc of the whole budget, sub-allocated by an Arena.
class CudaArenaAllocator final : public Allocator {
 public:
  static absl::StatusOr<std::unique_ptr<CudaArenaAllocator>> Create(uint64_t budget_bytes,
                                                                     MemoryTracker* tracker);
  ~CudaArenaAllocator() override;

 protected:
  void* RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;
  void ZeroFill(void* p, size_t bytes) override;

 private:
  CudaArenaAllocator(void* base, uint64_t bytes, MemoryTracker* tracker);
  void* base_;
  std::mutex mu_;
  Arena arena_;
};

// The pinned-host tier of a CUDA engine: host memory registered with cudaHostRegister, so device copies
// from and to it are asynchronous DMA. Registration is a hint: where the driver refuses it (a locked-memory
// or IOMMU limit), the block stays ordinary host memory, copies still work synchronously, and the first
// refusal is logged.
class CudaHostAllocator final : public Allocator {
 public:
  CudaHostAllocator(uint64_t budget_bytes, MemoryTracker* tracker)
      : Allocator(Tier::kPinnedHost, budget_bytes, tracker) {}

 protected:
  void* RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;
};

}  // namespace strata::memory
