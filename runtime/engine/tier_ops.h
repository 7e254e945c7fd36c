// TierOps: everything the engine does to the *contents* of its buffers, by the memory a tier is made of.
// Not a public header.
//
// Note [Tier ops]. The engine's state lives on tiers (Note [Tier placement]); what it does to the bytes
// (zero, accumulate, scale, norm, optimizer update, cast, copies to and from the host) depends on whether
// the tier is host memory or device memory. Host builds and the pinned-host tier use HostTierOps: the
// host kernels (kernels/cpu through runtime/optim), exactly the calls the engine always made, so host
// results are unchanged bit for bit. Its optimizer update runs on the engine's HostExecutor
// (strata.optimizer_threads), whose results are the same bits for every thread count. A CUDA device
// tier uses CudaTierOps (tier_ops_cuda.cc): the kernels/cuda twins, which share the element math, on a
// private stream of the engine's device.
//
// Conventions. Pointers belong to the tier the ops were made for. "Blocking" calls return when the
// work is complete (and report its error); "On(stream)" calls enqueue in stream order and return at once.
// Code that needs host access to a tier that is not host_visible() copies through ToHost / FromHost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/base/dtype.h"
#include "runtime/device/device.h"
#include "runtime/optim/hyper.h"
#include "runtime/optim/optimizer.h"
#include "runtime/shard/layout.h"

namespace strata::engine {

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

  // Blocking, for the optimizer step (all pointers on this tier):
  virtual absl::Status Scale(float* p, size_t n, float factor) = 0;
  virtual absl::StatusOr<double> SumSquares(const float* p, size_t n) = 0;
  // optim::ApplyUpdate over `segs`; `param_copy` (may be null) receives the updated master in
  // `copy_dtype` (kBF16 / kF16) in the same pass.
  virtual absl::Status Update(const optim::OptimizerConfig& cfg, const optim::ShardState& s,
                              const std::vector<shard::Segment>& segs, absl::Span<const optim::GroupHyper> groups,
                              int64_t step, float grad_scale, uint16_t* param_copy, DType copy_dtype) = 0;
  // dst[i] = src[i] in `to` (kF32: a copy; kBF16 / kF16: round to nearest even).
  virtual absl::Status Cast(DType to, const float* src, void* dst, size_t n) = 0;
};

// `executor` is the slot holding the executor Update() runs on (read at each call, so the engine may
// replace it between steps; an empty slot: the calling thread). The slot must outlive the ops.
std::unique_ptr<TierOps> MakeHostTierOps(const std::unique_ptr<optim::HostExecutor>* executor);

// CUDA builds: the device tier of `device` (a CUDA device), made by the CUDA back-end module
// (tier_ops_cuda.h); FailedPrecondition when the module is absent. Unimplemented on host builds.
absl::StatusOr<std::unique_ptr<TierOps>> MakeCudaTierOps(device::Device& device);

}  // namespace strata::engine
