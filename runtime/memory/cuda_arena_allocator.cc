#include "runtime/memory/cuda_arena_allocator.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda_device.h"

namespace strata::memory {

absl::StatusOr<std::unique_ptr<CudaArenaAllocator>> CudaArenaAllocator::Create(uint64_t budget_bytes,
                                                                               MemoryTracker* tracker) {
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMemGetInfo(&free_bytes, &total_bytes)));
  if (budget_bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("device budget of ", budget_bytes, " bytes exceeds the ",
                                                     free_bytes, " bytes free on the GPU; lower --device-budget"));
  }
  void* base = nullptr;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_CALL(cudaMalloc(&base, budget_bytes)));
  return std::unique_ptr<CudaArenaAllocator>(new CudaArenaAllocator(base, budget_bytes, tracker));
}

CudaArenaAllocator::CudaArenaAllocator(void* base, uint64_t bytes, MemoryTracker* tracker)
    : Allocator(Tier::kDevice, bytes, tracker), base_(base), arena_(base, bytes, 256) {}

CudaArenaAllocator::~CudaArenaAllocator() { cudaFree(base_); }

void* CudaArenaAllocator::RawAllocate(size_t bytes, size_t alignment) {
  std::lock_guard<std::mutex> lock(mu_);
  auto p = arena_.Allocate(bytes);  // 256-byte aligned, which covers every alignment the engine asks for
  return p.ok() && reinterpret_cast<uintptr_t>(*p) % alignment == 0 ? *p : nullptr;
}

void CudaArenaAllocator::RawFree(void* p, size_t) {
  std::lock_guard<std::mutex> lock(mu_);
  arena_.Free(p).IgnoreError();
}

void CudaArenaAllocator::ZeroFill(void* p, size_t bytes) { cudaMemset(p, 0, bytes); }

}  // namespace strata::memory
