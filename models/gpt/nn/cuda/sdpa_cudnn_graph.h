// The cuDNN operation graphs of causal scaled-dot-product attention, forward and backward, in the shape
// cuDNN 9's fused flash-attention engines recognise (Note [SDPA graphs] in sdpa_cudnn_graph.cc), built
// into finalized plans. Internal to strata_gpt_cudnn (sdpa_cudnn.cc caches and runs them).
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>

#include "models/gpt/nn/cuda/cudnn_graph_util.h"
#include "models/gpt/nn/cuda/sdpa_layout.h"
#include "models/gpt/nn/cuda/sdpa_status.h"

namespace strata::kernels::cuda {

// The uids of the tensors bound at execution (the variant pack).
enum SdpaUid : int64_t {
  kSdpaUidQ = 1,
  kSdpaUidK,  // K^T [B, NH, hd, T] view of qkv
  kSdpaUidV,  // V [B, NH, T, hd] (forward) or V^T [B, NH, hd, T] (backward) view of qkv
  kSdpaUidO,
  kSdpaUidStats,
  kSdpaUidDO,
  kSdpaUidDQ,
  kSdpaUidDK,
  kSdpaUidDV,
  kSdpaUidSoftmaxSum,  // backward scratch: rowsum(dO * O), fp32 [B, NH, T, 1]
  kSdpaUidDQAccum,     // backward scratch: dQ accumulated in fp32 [B, NH, T, hd]
};

// Builds and finalizes the plan of key.pass for key's shape and dtype on `handle`'s device.
// kUnsupported when cuDNN rejects the graph or no engine can run it (the message says which and why).
SdpaStatus BuildSdpaPlan(cudnnHandle_t handle, const SdpaPlanKey& key, cudnn_graph::Plan* plan);

// Declares key.pass's graph and finalizes its operation graph without a handle: no GPU needed. Ok means
// cuDNN accepted every tensor, every operation and the graph (not yet that an engine runs it).
SdpaStatus CheckSdpaGraph(const SdpaPlanKey& key);

}  // namespace strata::kernels::cuda
