// Index math of the cuDNN attention path (sdpa_cudnn.h): how GPT's qkv[B,T,3C] / out[B,T,C] buffers are
// described to cuDNN as [B, NH, T, hd] views by strides alone (no transpose copy), the shape rules that do
// not depend on the GPU or the cuDNN version, and the key finalized plans are cached under. Pure host
// code without cuDNN, so CI tests it everywhere (tests/models/gpt/nn/cuda/sdpa_layout_test.cc).
//
// Note [SDPA views]
// With hd = C / NH, element qkv[b, t, part * C + h * hd + d] (part 0 = q, 1 = k, 2 = v) is element
// (b, h, t, d) of the view
//     dims {B, NH, T, hd}, strides {T * 3C, hd, 3C, 1}, starting part * C elements into qkv.
// cuDNN's first product takes K transposed, [B, NH, hd, T]: the same elements with the last two dims and
// strides swapped, strides {T * 3C, hd, 1, 3C}; the backward's dO * V^T takes V the same way.
// out[b, t, h * hd + d] (and dout) is element (b, h, t, d) of dims {B, NH, T, hd}, strides {T * C, hd, C, 1}.
// dqkv has qkv's layout, so dQ, dK and dV are the q, k and v views of it.
// The softmax statistics (natural-log log-sum-exp of each scaled, masked score row, fp32) are packed
// [B, NH, T, 1]: strides {NH * T, T, 1, 1}, i.e. a caller's float stats[B][NH][T].
// Every view has unit stride along the head dimension, which cuDNN's SDPA engines require, and its
// pointer is 16-byte aligned whenever the buffer is and hd % 8 == 0 (C * 2 bytes is then a multiple of 16).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/gpt/nn/cuda/sdpa_status.h"

namespace strata::kernels::cuda {

// B batch, T sequence, C channels, NH heads: the shapes of models/gpt/nn/cpu/nn.h AttentionForward.
struct SdpaShape {
  int B = 0, T = 0, C = 0, NH = 0;
  int HeadDim() const { return NH > 0 ? C / NH : 0; }
};

enum class SdpaDtype : uint8_t { kBf16, kF16 };  // of qkv, out, dout, dqkv (stats are always fp32)
enum class SdpaPass : uint8_t { kForward, kBackward };
const char* SdpaDtypeName(SdpaDtype dtype);
const char* SdpaPassName(SdpaPass pass);

using Dims4 = std::array<int64_t, 4>;

// A 4-d strided view into a buffer: element (i0, i1, i2, i3) is buffer[offset_elems + sum_k i_k strides[k]].
struct SdpaView {
  Dims4 dims{};
  Dims4 strides{};
  int64_t offset_elems = 0;
};

enum class QkvPart { kQ = 0, kK = 1, kV = 2 };

SdpaView QkvView(const SdpaShape& s, QkvPart part);            // [B, NH, T, hd] into qkv / dqkv
SdpaView QkvTransposedView(const SdpaShape& s, QkvPart part);  // [B, NH, hd, T] into qkv
SdpaView OutView(const SdpaShape& s);                          // [B, NH, T, hd] into out / dout
SdpaView StatsView(const SdpaShape& s);                        // [B, NH, T, 1] packed fp32
// Row-major (last dim fastest) strides of `dims`, for cuDNN's intermediate tensors.
Dims4 PackedStrides(const Dims4& dims);
// One past the largest element index `v` touches (0 for an empty view): the buffer size it needs.
int64_t ViewSpanElems(const SdpaView& v);

// The rules that hold for every GPU and cuDNN version (sdpa_cudnn.h SdpaSupported adds those): all sizes
// positive (kInvalidArgument otherwise; callers treat B == 0 or T == 0 as nothing to do before asking),
// C % NH == 0 (kInvalidArgument), head dim a multiple of 8 and at most 256 (kUnsupported, naming why).
SdpaStatus CheckSdpaShape(const SdpaShape& s);

// What a finalized cuDNN plan depends on: the views' dims and strides follow from (B, NH, T, hd), and
// the graph from the dtype and the pass. A plan is bound to the device its context was created on.
struct SdpaPlanKey {
  int64_t B = 0, NH = 0, T = 0, head_dim = 0;
  SdpaDtype dtype = SdpaDtype::kBf16;
  SdpaPass pass = SdpaPass::kForward;

  friend bool operator==(const SdpaPlanKey&, const SdpaPlanKey&) = default;
  std::string ToString() const;  // "forward bf16 B=4 NH=12 T=1024 hd=64"
};
SdpaPlanKey MakeSdpaPlanKey(const SdpaShape& s, SdpaDtype dtype, SdpaPass pass);
struct SdpaPlanKeyHash {
  size_t operator()(const SdpaPlanKey& k) const;
};

// Where the parts of one call's workspace go: [cuDNN's plan workspace | backward only: rowsum(dO * O),
// fp32 [B, NH, T] | backward only: the fp32 dQ accumulator, [B, NH, T, hd]] (Note [SDPA graphs] in
// sdpa_cudnn_graph.cc), each part starting at a multiple of kSdpaScratchAlign bytes.
inline constexpr size_t kSdpaScratchAlign = 256;
struct SdpaWorkspaceLayout {
  size_t softmax_sum_offset = 0;  // bytes from the workspace's start (backward)
  size_t dq_accum_offset = 0;
  size_t dq_accum_bytes = 0;
  size_t total_bytes = 0;
};
SdpaWorkspaceLayout SdpaWorkspaceLayoutOf(const SdpaPlanKey& key, int64_t plan_workspace_bytes);

}  // namespace strata::kernels::cuda
