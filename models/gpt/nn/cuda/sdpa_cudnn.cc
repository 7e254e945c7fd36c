// cuDNN SDPA entry points (sdpa_cudnn.h): the support rules, the plan cache, the workspace and the
// binding of the caller's buffers to the graphs' tensors (Note [SDPA views], Note [SDPA graphs]).
#include "models/gpt/nn/cuda/sdpa_cudnn.h"

#include <cudnn.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/gpt/nn/cuda/cudnn_graph_util.h"
#include "models/gpt/nn/cuda/sdpa_cudnn_graph.h"

namespace strata::kernels::cuda {

using cudnn_graph::CudaFailure;
using cudnn_graph::CudnnFailure;
using cudnn_graph::Plan;

struct SdpaContext::Impl {
  cudnnHandle_t handle = nullptr;
  int device = 0;
  int sm = 0;
  size_t cudnn_version = 0;
  std::unordered_map<SdpaPlanKey, std::unique_ptr<Plan>, SdpaPlanKeyHash> plans;
  void* workspace = nullptr;  // the context's own, used when a call brings none
  size_t workspace_bytes = 0;

  ~Impl() {
    if (workspace != nullptr) cudaFree(workspace);
    plans.clear();  // the plans' descriptors go before the handle
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

namespace {

constexpr uintptr_t kPointerAlign = 16;  // the tensors' declared CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT

std::string VersionString(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

SdpaStatus InvalidArgument(std::string message) {
  return SdpaStatus::Error(SdpaCode::kInvalidArgument, std::move(message));
}

SdpaStatus CheckPointers(const std::string& what, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  for (const auto& [name, p] : ptrs) {
    if (p == nullptr) return InvalidArgument(what + ": " + name + " is null");
    if (reinterpret_cast<uintptr_t>(p) % kPointerAlign != 0) {
      return InvalidArgument(what + ": " + name + " is not " + std::to_string(kPointerAlign) + "-byte aligned");
    }
  }
  return SdpaStatus::Ok();
}

// The cached plan of `key`, built on first use. A failed build is not cached.
SdpaStatus GetPlan(SdpaContext::Impl& impl, const SdpaPlanKey& key, const Plan** out) {
  auto it = impl.plans.find(key);
  if (it == impl.plans.end()) {
    auto plan = std::make_unique<Plan>();
    if (SdpaStatus s = BuildSdpaPlan(impl.handle, key, plan.get()); !s.ok()) return s;
    it = impl.plans.emplace(key, std::move(plan)).first;
  }
  *out = it->second.get();
  return SdpaStatus::Ok();
}

// The call's workspace: the caller's (checked) or the context's own, grown to `need` bytes. Growing
// frees the old buffer first; cudaFree waits for the device, so no queued call still uses it.
SdpaStatus ResolveWorkspace(SdpaContext::Impl& impl, SdpaWorkspace ws, size_t need, const std::string& what,
                            char** base) {
  if (ws.data != nullptr) {
    if (ws.bytes < need) {
      return InvalidArgument(what + ": workspace of " + std::to_string(ws.bytes) + " bytes, needs " +
                             std::to_string(need));
    }
    if (reinterpret_cast<uintptr_t>(ws.data) % kSdpaScratchAlign != 0) {
      return InvalidArgument(what + ": workspace is not " + std::to_string(kSdpaScratchAlign) + "-byte aligned");
    }
    *base = static_cast<char*>(ws.data);
    return SdpaStatus::Ok();
  }
  if (impl.workspace_bytes < need) {
    if (impl.workspace != nullptr) {
      const cudaError_t e = cudaFree(impl.workspace);
      impl.workspace = nullptr;
      impl.workspace_bytes = 0;
      if (e != cudaSuccess) return CudaFailure(what, "cudaFree(old workspace)", e);
    }
    const cudaError_t e = cudaMalloc(&impl.workspace, need);
    if (e != cudaSuccess) {
      impl.workspace = nullptr;
      (void)cudaGetLastError();  // not sticky; clear it so a fallback kernel's launch check does not see it
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return SdpaStatus::Error(SdpaCode::kResourceExhausted,
                               what + ": device workspace: asked " + std::to_string(need) + " bytes, " +
                                   std::to_string(free_bytes) + " free (cudaMalloc: " + cudaGetErrorString(e) + ")");
    }
    impl.workspace_bytes = need;
  }
  *base = static_cast<char*>(impl.workspace);
  return SdpaStatus::Ok();
}

// What one call runs with.
struct Call {
  const Plan* plan = nullptr;
  SdpaWorkspaceLayout layout;
  char* workspace = nullptr;
};

// The common prologue after the support and pointer checks: plan, workspace, stream.
SdpaStatus Prepare(SdpaContext& ctx, const SdpaShape& s, SdpaDtype dtype, SdpaPass pass, SdpaWorkspace ws,
                   cudaStream_t stream, const std::string& what, Call* call) {
  SdpaContext::Impl& impl = ctx.impl();
  const SdpaPlanKey key = MakeSdpaPlanKey(s, dtype, pass);
  if (SdpaStatus st = GetPlan(impl, key, &call->plan); !st.ok()) return st;
  call->layout = SdpaWorkspaceLayoutOf(key, call->plan->workspace_bytes);
  if (SdpaStatus st = ResolveWorkspace(impl, ws, call->layout.total_bytes, what, &call->workspace); !st.ok()) {
    return st;
  }
  const cudnnStatus_t st = cudnnSetStream(impl.handle, stream);
  return st == CUDNN_STATUS_SUCCESS ? SdpaStatus::Ok() : CudnnFailure(what, "cudnnSetStream", st);
}

bool Empty(const SdpaShape& s) { return (s.B == 0 && s.T >= 0) || (s.T == 0 && s.B >= 0); }

// A device pointer to element `offset` of a 16-bit buffer, as the variant pack wants it.
void* At(const uint16_t* base, int64_t offset) { return const_cast<uint16_t*>(base) + offset; }

}  // namespace

SdpaContext::SdpaContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SdpaContext::~SdpaContext() = default;

int SdpaContext::device() const { return impl_->device; }
int SdpaContext::sm_version() const { return impl_->sm; }
size_t SdpaContext::cudnn_version() const { return impl_->cudnn_version; }
size_t SdpaContext::cached_plans() const { return impl_->plans.size(); }

SdpaStatus SdpaContext::Create(std::unique_ptr<SdpaContext>* out) {
  const std::string what = "SdpaContext::Create";
  auto impl = std::make_unique<Impl>();
  int major = 0, minor = 0;
  if (const cudaError_t e = cudaGetDevice(&impl->device); e != cudaSuccess)
    return CudaFailure(what, "cudaGetDevice", e);
  if (const cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, impl->device);
      e != cudaSuccess) {
    return CudaFailure(what, "cudaDeviceGetAttribute(major)", e);
  }
  if (const cudaError_t e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, impl->device);
      e != cudaSuccess) {
    return CudaFailure(what, "cudaDeviceGetAttribute(minor)", e);
  }
  impl->sm = 10 * major + minor;
  impl->cudnn_version = cudnnGetVersion();
  if (const cudnnStatus_t st = cudnnCreate(&impl->handle); st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return CudnnFailure(what, "cudnnCreate", st);
  }
  out->reset(new SdpaContext(std::move(impl)));
  return SdpaStatus::Ok();
}

SdpaStatus SdpaSupported(const SdpaContext& ctx, const SdpaShape& s, SdpaDtype dtype, SdpaPass pass) {
  if (SdpaStatus st = CheckSdpaShape(s); !st.ok()) return st;
  const SdpaContext::Impl& impl = ctx.impl();
  const std::string what = "cuDNN SDPA " + MakeSdpaPlanKey(s, dtype, pass).ToString() + " on SM" +
                           std::to_string(impl.sm) + " with cuDNN " + VersionString(impl.cudnn_version) + ": ";
  const auto unsupported = [&](const std::string& why) {
    return SdpaStatus::Error(SdpaCode::kUnsupported, what + why);
  };
  // The rules below are cuDNN's published SDPA support surface (Note [SDPA graphs]).
  const size_t v = impl.cudnn_version;
  if (v < 90000) return unsupported("needs cuDNN 9.0 or newer (the graph is the one cuDNN 9 fuses)");
  if (v / 10000 != CUDNN_MAJOR) {
    return unsupported("the loaded cuDNN's major version differs from the headers' (" + VersionString(CUDNN_VERSION) +
                       ")");
  }
  if (impl.sm < 80) return unsupported("cuDNN's fused attention needs SM80 (Ampere) or newer");
  if (s.HeadDim() > 128 && impl.sm / 10 != 9) return unsupported("head dims above 128 need Hopper (SM90)");
  if (pass == SdpaPass::kForward && (v == 91000 || v == 91001)) {
    return unsupported("cuDNN 9.10.0 and 9.10.1 have a known SDPA forward bug (9.10.2 fixes it)");
  }
  if (pass == SdpaPass::kBackward && v <= 91500 && s.T % 128 != 0) {
    return unsupported("up to cuDNN 9.15.0 the SDPA backward needs T % 128 == 0 (it would need a padding mask)");
  }
  return SdpaStatus::Ok();
}

SdpaStatus SdpaWorkspaceBytes(SdpaContext& ctx, const SdpaShape& s, SdpaDtype dtype, SdpaPass pass, size_t* bytes) {
  *bytes = 0;
  if (Empty(s)) return SdpaStatus::Ok();
  if (SdpaStatus st = SdpaSupported(ctx, s, dtype, pass); !st.ok()) return st;
  const SdpaPlanKey key = MakeSdpaPlanKey(s, dtype, pass);
  const Plan* plan = nullptr;
  if (SdpaStatus st = GetPlan(ctx.impl(), key, &plan); !st.ok()) return st;
  *bytes = SdpaWorkspaceLayoutOf(key, plan->workspace_bytes).total_bytes;
  return SdpaStatus::Ok();
}

SdpaStatus SdpaForward(SdpaContext& ctx, SdpaDtype dtype, const SdpaShape& s, const uint16_t* qkv, uint16_t* out,
                       float* stats, cudaStream_t stream, SdpaWorkspace workspace) {
  if (Empty(s)) return SdpaStatus::Ok();
  if (SdpaStatus st = SdpaSupported(ctx, s, dtype, SdpaPass::kForward); !st.ok()) return st;
  const std::string what = "SdpaForward(" + MakeSdpaPlanKey(s, dtype, SdpaPass::kForward).ToString() + ")";
  if (SdpaStatus st = CheckPointers(what, {{"qkv", qkv}, {"out", out}, {"stats", stats}}); !st.ok()) return st;
  Call call;
  if (SdpaStatus st = Prepare(ctx, s, dtype, SdpaPass::kForward, workspace, stream, what, &call); !st.ok()) return st;
  const std::vector<std::pair<int64_t, void*>> bindings = {
      {kSdpaUidQ, At(qkv, QkvView(s, QkvPart::kQ).offset_elems)},
      {kSdpaUidK, At(qkv, QkvView(s, QkvPart::kK).offset_elems)},
      {kSdpaUidV, At(qkv, QkvView(s, QkvPart::kV).offset_elems)},
      {kSdpaUidO, out},
      {kSdpaUidStats, stats},
  };
  return cudnn_graph::Execute(ctx.impl().handle, *call.plan, bindings, call.workspace);
}

SdpaStatus SdpaBackward(SdpaContext& ctx, SdpaDtype dtype, const SdpaShape& s, const uint16_t* dout,
                        const uint16_t* qkv, const uint16_t* out, const float* stats, uint16_t* dqkv,
                        cudaStream_t stream, SdpaWorkspace workspace) {
  if (Empty(s)) return SdpaStatus::Ok();
  if (SdpaStatus st = SdpaSupported(ctx, s, dtype, SdpaPass::kBackward); !st.ok()) return st;
  const std::string what = "SdpaBackward(" + MakeSdpaPlanKey(s, dtype, SdpaPass::kBackward).ToString() + ")";
  if (SdpaStatus st =
          CheckPointers(what, {{"dout", dout}, {"qkv", qkv}, {"out", out}, {"stats", stats}, {"dqkv", dqkv}});
      !st.ok()) {
    return st;
  }
  Call call;
  if (SdpaStatus st = Prepare(ctx, s, dtype, SdpaPass::kBackward, workspace, stream, what, &call); !st.ok()) {
    return st;
  }
  char* dq_accum = call.workspace + call.layout.dq_accum_offset;
  // Before cuDNN 9.6 the backward accumulated into dQ without clearing it first (cudnn-frontend zeroed
  // it for the engine); from 9.6 the engine is said to. The workspace is shared by every layer, so a
  // stale accumulator would add one layer's dQ to the next: it is cleared every time (B x NH x T x hd
  // fp32, a few microseconds), whatever the version says.
  if (const cudaError_t e = cudaMemsetAsync(dq_accum, 0, call.layout.dq_accum_bytes, stream); e != cudaSuccess) {
    return CudaFailure(what, "cudaMemsetAsync(dQ accumulator)", e);
  }
  const std::vector<std::pair<int64_t, void*>> bindings = {
      {kSdpaUidQ, At(qkv, QkvView(s, QkvPart::kQ).offset_elems)},
      {kSdpaUidK, At(qkv, QkvView(s, QkvPart::kK).offset_elems)},
      {kSdpaUidV, At(qkv, QkvView(s, QkvPart::kV).offset_elems)},
      {kSdpaUidO, At(out, 0)},
      {kSdpaUidDO, At(dout, 0)},
      {kSdpaUidStats, const_cast<float*>(stats)},
      {kSdpaUidDQ, At(dqkv, QkvView(s, QkvPart::kQ).offset_elems)},
      {kSdpaUidDK, At(dqkv, QkvView(s, QkvPart::kK).offset_elems)},
      {kSdpaUidDV, At(dqkv, QkvView(s, QkvPart::kV).offset_elems)},
      {kSdpaUidSoftmaxSum, call.workspace + call.layout.softmax_sum_offset},
      {kSdpaUidDQAccum, dq_accum},
  };
  return cudnn_graph::Execute(ctx.impl().handle, *call.plan, bindings, call.workspace);
}

}  // namespace strata::kernels::cuda
