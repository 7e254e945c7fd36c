// TierOps: the operations on the *contents* of a tier's buffers, by the memory the tier is made of.
//
// Note [Tier ops]. Buffers live on tiers (memory.h: device, pinned host; which state goes where is Note
// [Tier placement] in runtime/engine/placement.h); what is done to their bytes (zero, accumulate, scale,
// sum of squares, cast, copies to and from the host) depends on whether the tier is host memory or device
// memory, so the operations live with the tier, as an allocator does: the layers above (shard/, optim/)
// are handed the TierOps of the memory they work on and call it directly, never a function object filled
// above them (docs/design.md "Calls only descend"). Host memory uses HostTierOps: the host kernels
// (kernels/cpu), exactly the calls the engine always made, so host results are unchanged bit for bit. A
// CUDA device tier uses CudaTierOps (tier_ops_cuda.cc): the kernels/cuda twins, which share the element
// math, on a private stream of the device. Both pass one conformance suite
// (tests/runtime/memory/tier_ops_conformance.h: host in ctest, CUDA in scripts/gpu_check). The optimizer's
// update over a tier is optim/'s (optim/tier_update.h), as it is the optimizer's arithmetic.
//
// Conventions. Pointers belong to the tier the ops were made for. "Blocking" calls return when the
// work is complete (and report its error); "On(stream)" calls enqueue in stream order and return at once.
// Code that needs host access to a tier that is not host_visible() copies through ToHost / FromHost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/device/device.h"

namespace strata::memory {

class TierOps {
 public:
  virtual ~TierOps() = default;
  // The CPU can read and write this tier's pointers directly.
  virtual bool host_visible() const = 0;

  // Blocking copies between this tier and host memory (`host` is ordinary or pinned host memory).
  virtual absl::Status ToHost(void* host, const void* src, size_t bytes) = 0;
  virtual absl::Status FromHost(void* dst, const void* host, size_t bytes) = 0;
  // Blocking: p[0, bytes) = 0.
  virtual absl::Status Zero(void* p, size_t bytes) = 0;
  // dst[i] += src[i] (fp32, both on this tier), in `stream` order.
  virtual void AccumulateOn(device::Stream& stream, float* dst, const float* src, size_t n) = 0;
  // `host[0, bytes)` = src[0, bytes), in `stream` order (host pinned for asynchronous device copies).
  virtual void ToHostOn(device::Stream& stream, void* host, const void* src, size_t bytes) = 0;
  // dst[0, bytes) = `host[0, bytes)`, in `stream` order (host pinned for asynchronous device copies).
  virtual void FromHostOn(device::Stream& stream, void* dst, const void* host, size_t bytes) = 0;

  // Blocking (all pointers on this tier): p[i] *= factor; the sum of squares of p[0, n) in double.
  virtual absl::Status Scale(float* p, size_t n, float factor) = 0;
  virtual absl::StatusOr<double> SumSquares(const float* p, size_t n) = 0;
  // dst[i] = src[i] in `to` (kF32: a copy; kBF16 / kF16: round to nearest even).
  virtual absl::Status Cast(DType to, const float* src, void* dst, size_t n) = 0;
};

// Where the host tier's casts run: a kernel variant and a thread pool (both null: the widest variant on
// the calling thread; every choice gives the same bits). Read at each call, so its owner may change it
// between calls (the engine's strata.optimizer_threads); it must outlive the ops.
struct HostThreads {
  const kernels::cpu::CpuKernels* kernels = nullptr;
  kernels::cpu::ThreadPool* pool = nullptr;
};

// Host memory (ordinary or pinned). `threads` may be null (the calling thread).
std::unique_ptr<TierOps> MakeHostTierOps(const HostThreads* threads = nullptr);

// CUDA builds: the device tier of `device` (a CUDA device), made by the CUDA back-end module
// (cuda_backend.h); FailedPrecondition when the module is absent. Unimplemented on host builds.
absl::StatusOr<std::unique_ptr<TierOps>> MakeCudaTierOps(device::Device& device);

}  // namespace strata::memory
