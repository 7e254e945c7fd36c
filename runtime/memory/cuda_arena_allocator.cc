#include "runtime/memory/cuda_arena_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
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

// cudaMemset runs on the legacy default stream, which the engine's non-blocking streams do not wait for:
// finish it before the block is handed out.
void CudaArenaAllocator::ZeroFill(void* p, size_t bytes) {
  if (cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy) == cudaSuccess) cudaStreamSynchronize(cudaStreamLegacy);
}


void* CudaHostAllocator::RawAllocate(size_t bytes, size_t alignment) {
  constexpr size_t kPage = 4096;  // whole pages, so that no two blocks share a registered page
  const size_t pages = RoundUp(bytes, kPage);
  void* p = AlignedHostAlloc(pages, alignment < kPage ? kPage : alignment);
  if (p == nullptr) return nullptr;
  const cudaError_t e = cudaHostRegister(p, pages, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky, but clear it so that later calls do not report it
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      STRATA_LOG(Warning) << "cudaHostRegister(" << bytes << " bytes) failed (" << cudaGetErrorString(e)
                          << "): the pinned-host tier stays pageable, so its device copies are synchronous";
    }
  }
  return p;
}

void CudaHostAllocator::RawFree(void* p, size_t) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();  // a block whose registration was refused
  std::free(p);
}

}  // namespace strata::memory
