// Views, shape rules and plan key of the cuDNN attention path (sdpa_layout.h, Note [SDPA views]).
#include "models/gpt/nn/cuda/sdpa_layout.h"

#include <functional>
#include <utility>

namespace strata::kernels::cuda {

const char* SdpaDtypeName(SdpaDtype dtype) { return dtype == SdpaDtype::kBf16 ? "bf16" : "fp16"; }
const char* SdpaPassName(SdpaPass pass) { return pass == SdpaPass::kForward ? "forward" : "backward"; }

SdpaView QkvView(const SdpaShape& s, QkvPart part) {
  const int64_t C = s.C, hd = s.HeadDim(), row = 3 * C;
  return {{s.B, s.NH, s.T, hd}, {s.T * row, hd, row, 1}, static_cast<int64_t>(part) * C};
}

SdpaView QkvTransposedView(const SdpaShape& s, QkvPart part) {
  SdpaView v = QkvView(s, part);
  std::swap(v.dims[2], v.dims[3]);
  std::swap(v.strides[2], v.strides[3]);
  return v;
}

SdpaView OutView(const SdpaShape& s) {
  const int64_t C = s.C, hd = s.HeadDim();
  return {{s.B, s.NH, s.T, hd}, {s.T * C, hd, C, 1}, 0};
}

SdpaView StatsView(const SdpaShape& s) {
  const Dims4 dims{s.B, s.NH, s.T, 1};
  return {dims, PackedStrides(dims), 0};
}

Dims4 PackedStrides(const Dims4& dims) {
  Dims4 strides{};
  int64_t stride = 1;
  for (int k = 3; k >= 0; --k) {
    strides[k] = stride;
    stride *= dims[k];
  }
  return strides;
}

int64_t ViewSpanElems(const SdpaView& v) {
  int64_t last = v.offset_elems;
  for (int k = 0; k < 4; ++k) {
    if (v.dims[k] <= 0) return 0;
    last += (v.dims[k] - 1) * v.strides[k];
  }
  return last + 1;
}

SdpaStatus CheckSdpaShape(const SdpaShape& s) {
  const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
                            " NH=" + std::to_string(s.NH);
  if (s.B <= 0 || s.T <= 0 || s.C <= 0 || s.NH <= 0) {
    return SdpaStatus::Error(SdpaCode::kInvalidArgument, "attention sizes must be positive (" + shape + ")");
  }
  if (s.C % s.NH != 0) {
    return SdpaStatus::Error(SdpaCode::kInvalidArgument, "C is not a multiple of NH (" + shape + ")");
  }
  const int hd = s.HeadDim();
  // cuDNN's fused SDPA engines take head dims that are multiples of 8 (16-byte rows of 16-bit data)
  // and at most 256 (Hopper; 128 elsewhere, checked in SdpaSupported).
  if (hd % 8 != 0) {
    return SdpaStatus::Error(
        SdpaCode::kUnsupported,
        "head dim " + std::to_string(hd) + " is not a multiple of 8, which cuDNN SDPA requires (" + shape + ")");
  }
  if (hd > 256) {
    return SdpaStatus::Error(SdpaCode::kUnsupported,
                             "head dim " + std::to_string(hd) + " exceeds cuDNN SDPA's 256 (" + shape + ")");
  }
  return SdpaStatus::Ok();
}

std::string SdpaPlanKey::ToString() const {
  return std::string(SdpaPassName(pass)) + " " + SdpaDtypeName(dtype) + " B=" + std::to_string(B) +
         " NH=" + std::to_string(NH) + " T=" + std::to_string(T) + " hd=" + std::to_string(head_dim);
}

SdpaPlanKey MakeSdpaPlanKey(const SdpaShape& s, SdpaDtype dtype, SdpaPass pass) {
  return {s.B, s.NH, s.T, s.HeadDim(), dtype, pass};
}

size_t SdpaPlanKeyHash::operator()(const SdpaPlanKey& k) const {
  size_t h = std::hash<int64_t>{}(k.B);
  for (const int64_t v : {k.NH, k.T, k.head_dim, static_cast<int64_t>(k.dtype), static_cast<int64_t>(k.pass)}) {
    h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  return h;
}

namespace {
size_t AlignUp(size_t n) { return (n + kSdpaScratchAlign - 1) / kSdpaScratchAlign * kSdpaScratchAlign; }
}  // namespace

SdpaWorkspaceLayout SdpaWorkspaceLayoutOf(const SdpaPlanKey& key, int64_t plan_workspace_bytes) {
  SdpaWorkspaceLayout l;
  l.total_bytes = AlignUp(static_cast<size_t>(plan_workspace_bytes));
  if (key.pass == SdpaPass::kBackward) {
    l.softmax_sum_offset = l.total_bytes;
    l.dq_accum_offset = l.softmax_sum_offset + AlignUp(static_cast<size_t>(key.B * key.NH * key.T) * sizeof(float));
    l.dq_accum_bytes = static_cast<size_t>(key.B * key.NH * key.T * key.head_dim) * sizeof(float);
    l.total_bytes = l.dq_accum_offset + AlignUp(l.dq_accum_bytes);
  }
  return l;
}

}  // namespace strata::kernels::cuda
