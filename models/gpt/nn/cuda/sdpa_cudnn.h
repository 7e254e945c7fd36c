// Causal multi-head attention through cuDNN's fused scaled-dot-product-attention engines (flash-attention
// style: the T x T scores never reach memory), the fast twin of the reference kernel in attention.cuh,
// which checks it (tests/models/gpt/nn/cuda/sdpa_cudnn_test.cc).
//
// Semantics, per head: out = softmax(causal(q k^T / sqrt(hd))) v on 16-bit (bf16 or fp16) qkv[B,T,3C] and
// out[B,T,C], the layouts of models/gpt/nn/cpu/nn.h, seen by cuDNN through strides (Note [SDPA views] in
// sdpa_layout.h; no transpose copies). Instead of the reference's att[B,NH,T,T] probabilities the forward
// saves stats[B,NH,T] (fp32, natural-log log-sum-exp of each scaled, masked score row); the backward
// recomputes the probabilities from stats and needs the forward's out. The backward writes all of
// dqkv[B,T,3C]. Accumulation is fp32; P (and dS^T, for dK) are rounded to the 16-bit type inside cuDNN.
//
// Support: SdpaSupported says, from documented rules and without building anything, whether this GPU and
// cuDNN can run a shape, and if not why (so the trainer keeps the reference kernel). A plan that cuDNN
// still rejects when built also returns kUnsupported; SdpaWorkspaceBytes builds the plans, so calling it
// for both passes at start-up gives the definitive answer before the first step.
//
// Plans: built on first use of each (pass, dtype, B, NH, T, hd) and cached in the context; a build can be
// slow (cuDNN compiles the fused kernels at run time; not yet measured). Graph: Note [SDPA graphs] in
// sdpa_cudnn_graph.cc.
//
// Errors: every call returns an SdpaStatus; a failed cuDNN call names itself, the graph and descriptor,
// the cudnnStatus_t string and cudnnGetLastErrorString. For each engine's reason for refusing a graph, run
// with cuDNN's own log: CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr (read by cuDNN, not by us).
//
// Threads, streams, memory: a context belongs to the device current at Create and is not thread-safe
// (one per thread and device). Forward and Backward enqueue on `stream` and return without waiting,
// except that the first call of a shape blocks while its plan is built (host work, which may load
// modules), and growing the context's own workspace (when the caller passes none) calls cudaFree /
// cudaMalloc, which synchronise the device: build the plans up front with SdpaWorkspaceBytes and pass a
// workspace that large to keep the hot path free of both. Pointers are device pointers, 16-byte aligned;
// outputs must not overlap inputs; buffers must stay valid until the stream's work is done.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "models/gpt/nn/cuda/sdpa_layout.h"
#include "models/gpt/nn/cuda/sdpa_status.h"

namespace strata::kernels::cuda {

// Owns a cuDNN handle, the cached plans and (optionally) a workspace. Not copyable; held by unique_ptr.
class SdpaContext {
 public:
  // Creates a context on the current device. Fails (kCudnnError / kCudaError) without a usable GPU.
  static SdpaStatus Create(std::unique_ptr<SdpaContext>* out);
  ~SdpaContext();
  SdpaContext(const SdpaContext&) = delete;
  SdpaContext& operator=(const SdpaContext&) = delete;

  int device() const;
  int sm_version() const;        // 10 * major + minor
  size_t cudnn_version() const;  // cudnnGetVersion(), e.g. 91900
  size_t cached_plans() const;

  // The implementation (sdpa_cudnn.cc); an incomplete type everywhere else.
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  explicit SdpaContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Scratch for one call: `data` (256-byte aligned) holding `bytes` >= SdpaWorkspaceBytes, or data ==
// nullptr to use the context's own buffer (allocated once, grown when a larger shape needs it).
struct SdpaWorkspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Ok, or why `pass` of this shape and dtype cannot run on the context's GPU and cuDNN: kInvalidArgument
// for impossible shapes, kUnsupported for a head dim cuDNN does not take (not a multiple of 8, above 128,
// or above 256 on Hopper), a GPU older than SM80, a cuDNN older than 9.0 or known broken for it.
SdpaStatus SdpaSupported(const SdpaContext& ctx, const SdpaShape& s, SdpaDtype dtype, SdpaPass pass);

// The workspace bytes one call of `pass` needs (building and caching its plan).
SdpaStatus SdpaWorkspaceBytes(SdpaContext& ctx, const SdpaShape& s, SdpaDtype dtype, SdpaPass pass, size_t* bytes);

// out[B,T,C] and stats[B,NH,T] (written) from qkv[B,T,3C]. B == 0 or T == 0 does nothing.
SdpaStatus SdpaForward(SdpaContext& ctx, SdpaDtype dtype, const SdpaShape& s, const uint16_t* qkv, uint16_t* out,
                       float* stats, cudaStream_t stream, SdpaWorkspace workspace = {});

// dqkv[B,T,3C] (written) from dout[B,T,C], given the forward's qkv, out and stats.
SdpaStatus SdpaBackward(SdpaContext& ctx, SdpaDtype dtype, const SdpaShape& s, const uint16_t* dout,
                        const uint16_t* qkv, const uint16_t* out, const float* stats, uint16_t* dqkv,
                        cudaStream_t stream, SdpaWorkspace workspace = {});

}  // namespace strata::kernels::cuda
