// Causal SDPA operation graphs for cuDNN's fused flash-attention engines (sdpa_cudnn_graph.h).
//
// Note [SDPA graphs]
// cuDNN 9 (before 9.21, which adds single SDPA / softmax / band-mask operations) runs fused attention
// when an operation graph of plain matmul, pointwise, reduction and reshape operations has the exact
// shape its specialised runtime-fusion engines recognise. What we relied on (read, not copied):
//  - The shape of those graphs is the one NVIDIA's cudnn-frontend lowers its SDPA nodes to
//    (github.com/NVIDIA/cudnn-frontend include/cudnn_frontend/node/scaled_dot_product_flash_attention.h:
//    CompositeSDPANode::expand_node and CompositeSDPABackwardNode::expand_node; node/softmax.h
//    CompositeSoftmaxNode; node/diagonal_band_mask.h CompositeDiagonalBandMaskNode; and
//    utils/attn_score_modifiers.h causal_mask = a right-bound-0, top-left-aligned band, kept where
//    row >= col, the rest filled with -inf from cuDNN 9.10 and with -FLT_MAX before). We mirror the
//    operation order, the virtual tensors' data types (fp32, except the second product's A operand and
//    the reshaped P^T / dS^T, which the backend wants in the I/O type) and the backward's fp32 dQ
//    accumulator and rowsum(dO * O) tensors, which the caller's workspace holds.
//  - K enters the first product as K^T and V the backward's dO V^T as V^T: views with swapped strides
//    (Note [SDPA views]); the head dimension keeps unit stride, as the frontend's validation demands.
//  - The support surface (docs.nvidia.com/cudnn "Attention" support matrix; cudnn-frontend
//    node/sdpa_support_surface.h): fp16 / bf16, SM80 or newer, head dim a multiple of 8 and at most 128
//    for the Ampere backward, 256 on Hopper (SdpaSupported allows above 128 only on Hopper, for both
//    passes: simpler, and conservative), BHSD / BSHD / interleaved layouts through strides, stats fp32
//    packed [B, NH, T, 1]; 9.10.0 and 9.10.1 have a forward bug; up to 9.15.0 the backward needs
//    T % 128 == 0 without a padding mask. SdpaSupported (sdpa_cudnn.cc) encodes these.
// Forward (scale = 1 / sqrt(hd); "virtual" tensors are never stored):
//   S = Q K^T; S1 = S * scale; keep = gen_index(axis 2) >= gen_index(axis 3);
//   S2 = select(keep, S1, -inf); M = rowmax(S2); E = exp(S2 - M); Z = rowsum(E);
//   Stats = M + log(Z) (bound); P = E / Z (I/O type); O = P V (bound).
// Backward (recomputes P from Stats, the flash-attention way):
//   D = rowsum(dO * O) * 1 (bound fp32 scratch; the "* 1" is the frontend's dropout rescale, kept so the
//   graph is the one the engine is known to accept); S1 = Q K^T * scale; P = exp(mask(S1) - Stats), the
//   mask filling with -FLT_MAX in every version, as the frontend's backward does;
//   dV = reshape(P)^T dO; dS = (dO V^T - D) * P * scale; dK = reshape(dS)^T Q;
//   dQacc = dS K (bound fp32 scratch, K the reshape of K^T back to [B, NH, T, hd]); dQ = identity(dQacc).
// Checked without a GPU (cuDNN 9.19; the operation graph finalized without a handle, and the heuristics
// and plans given a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR describing an H200, then an A100): cuDNN classifies
// both graphs as SDPA_FWD / SDPA_BWD for bf16 and fp16, T = 64 ... 1024, head dims 64 ... 256, and its
// mode-A heuristics propose the flash-attention engines (forward engines 1 and 2, backward 6 and 7),
// whose plans then stop only at run-time compilation, for want of libcuda on that machine. A graph with P
// left in fp32 is, by contrast, rejected by the pattern check. The backward used to subtract Stats before
// masking (the same numbers: both orders give exp(...) = 0 where masked); cuDNN proposed engines 6 and 7
// for either order, and the frontend's order is kept since it is the one known to run. Whether a plan finalizes, what
// it computes and how fast, only a GPU run shows: a rejected graph comes back as kUnsupported with cuDNN's per-engine
// reasons (cudnn_graph_util.h), and the trainer falls back to the reference kernel.
#include "models/gpt/nn/cuda/sdpa_cudnn_graph.h"

#include <cmath>
#include <limits>

namespace strata::kernels::cuda {
namespace {

using cudnn_graph::GraphBuilder;

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

SdpaShape ShapeOf(const SdpaPlanKey& k) {
  return {static_cast<int>(k.B), static_cast<int>(k.T), static_cast<int>(k.NH * k.head_dim), static_cast<int>(k.NH)};
}

cudnnDataType_t IoType(SdpaDtype dtype) { return dtype == SdpaDtype::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// The fill value of the forward's masked scores (Note [SDPA graphs]).
float ForwardMaskFill() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

// select(row >= col, scores, fill): the causal (top-left aligned) mask of a [B, NH, T, T] score tensor.
int64_t CausalMask(GraphBuilder& g, int64_t scores, const Dims4& dims, float fill_value) {
  const int64_t fill = g.Scalar("mask fill", fill_value);
  const int64_t row = g.Virtual("row index", CUDNN_DATA_INT32, dims);
  const int64_t col = g.Virtual("column index", CUDNN_DATA_INT32, dims);
  const int64_t keep = g.Virtual("row >= column", CUDNN_DATA_BOOLEAN, dims);
  const int64_t masked = g.Virtual("masked scores", kF32, dims);
  g.GenIndex("row index", scores, row, /*axis=*/2);
  g.GenIndex("column index", scores, col, /*axis=*/3);
  g.Pointwise("row >= column", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, keep, row, col);
  g.Pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, kF32, masked, scores, fill, keep);
  return masked;
}

// scale * Q K^T.
int64_t ScaledScores(GraphBuilder& g, int64_t q, int64_t kt, int64_t scale, const Dims4& dims) {
  const int64_t s = g.Virtual("S = Q K^T", kF32, dims);
  const int64_t scaled = g.Virtual("S * scale", kF32, dims);
  g.Matmul("Q K^T", q, kt, s);
  g.Pointwise("S * scale", CUDNN_POINTWISE_MUL, kF32, scaled, s, scale);
  return scaled;
}

float AttnScale(const SdpaPlanKey& k) { return 1.0f / std::sqrt(static_cast<float>(k.head_dim)); }

// The tensors both passes bind or use: Q, K^T, V (as V^T in the backward, for dO V^T), O, the stats
// and the attention scale.
struct CommonTensors {
  int64_t q, kt, v, o, stats, scale;
};

CommonTensors DeclareCommonTensors(GraphBuilder& g, const SdpaPlanKey& key) {
  const SdpaShape s = ShapeOf(key);
  const cudnnDataType_t io = IoType(key.dtype);
  const bool forward = key.pass == SdpaPass::kForward;
  CommonTensors t;
  t.q = g.Tensor(kSdpaUidQ, "Q", io, QkvView(s, QkvPart::kQ));
  t.kt = g.Tensor(kSdpaUidK, "K^T", io, QkvTransposedView(s, QkvPart::kK));
  t.v = forward ? g.Tensor(kSdpaUidV, "V", io, QkvView(s, QkvPart::kV))
                : g.Tensor(kSdpaUidV, "V^T", io, QkvTransposedView(s, QkvPart::kV));
  t.o = g.Tensor(kSdpaUidO, "O", io, OutView(s));
  t.stats = g.Tensor(kSdpaUidStats, "Stats", kF32, StatsView(s));
  t.scale = g.Scalar("attention scale", AttnScale(key));
  return t;
}

void DeclareForward(GraphBuilder& g, const SdpaPlanKey& key) {
  const cudnnDataType_t io = IoType(key.dtype);
  const Dims4 scores{key.B, key.NH, key.T, key.T}, rows{key.B, key.NH, key.T, 1};
  const CommonTensors t = DeclareCommonTensors(g, key);

  const int64_t masked = CausalMask(g, ScaledScores(g, t.q, t.kt, t.scale, scores), scores, ForwardMaskFill());
  // Softmax with its log-sum-exp saved for the backward (the frontend's composite softmax).
  const int64_t max = g.Virtual("row max", kF32, rows);
  const int64_t shifted = g.Virtual("S - max", kF32, scores);
  const int64_t e = g.Virtual("exp(S - max)", kF32, scores);
  const int64_t sum = g.Virtual("row sum", kF32, rows);
  const int64_t log_sum = g.Virtual("log(row sum)", kF32, rows);
  const int64_t p = g.Virtual("P", io, scores);
  g.Reduction("row max", CUDNN_REDUCE_TENSOR_MAX, masked, max);
  g.Pointwise("S - max", CUDNN_POINTWISE_SUB, kF32, shifted, masked, max);
  g.Pointwise("exp", CUDNN_POINTWISE_EXP, kF32, e, shifted);
  g.Reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.Pointwise("log", CUDNN_POINTWISE_LOG, kF32, log_sum, sum);
  g.Pointwise("stats = max + log(sum)", CUDNN_POINTWISE_ADD, kF32, t.stats, max, log_sum);
  g.Pointwise("P = exp / sum", CUDNN_POINTWISE_DIV, kF32, p, e, sum);
  g.Matmul("P V", p, t.v, t.o);
}

void DeclareBackward(GraphBuilder& g, const SdpaPlanKey& key) {
  const SdpaShape s = ShapeOf(key);
  const cudnnDataType_t io = IoType(key.dtype);
  const Dims4 scores{key.B, key.NH, key.T, key.T}, rows{key.B, key.NH, key.T, 1};
  const Dims4 heads{key.B, key.NH, key.T, key.head_dim};
  // The transpose of a packed [B, NH, T, T] tensor: last two dims' strides swapped.
  const Dims4 transposed{key.NH * key.T * key.T, key.T * key.T, 1, key.T};
  const CommonTensors t = DeclareCommonTensors(g, key);
  const int64_t q = t.q, kt = t.kt, vt = t.v, scale = t.scale;
  const int64_t d_o = g.Tensor(kSdpaUidDO, "dO", io, OutView(s));
  const int64_t dq = g.Tensor(kSdpaUidDQ, "dQ", io, QkvView(s, QkvPart::kQ));
  const int64_t dk = g.Tensor(kSdpaUidDK, "dK", io, QkvView(s, QkvPart::kK));
  const int64_t dv = g.Tensor(kSdpaUidDV, "dV", io, QkvView(s, QkvPart::kV));
  const int64_t softmax_sum = g.Tensor(kSdpaUidSoftmaxSum, "rowsum(dO * O)", kF32, {rows, PackedStrides(rows), 0});
  const int64_t dq_accum = g.Tensor(kSdpaUidDQAccum, "dQ accumulator", kF32, {heads, PackedStrides(heads), 0});
  const int64_t one = g.Scalar("one", 1.0f);

  // D = rowsum(dO * O).
  const int64_t do_o = g.Virtual("dO * O", kF32, heads);
  const int64_t do_o_sum = g.Virtual("rowsum(dO * O)", kF32, rows);
  g.Pointwise("dO * O", CUDNN_POINTWISE_MUL, kF32, do_o, d_o, t.o);
  g.Reduction("rowsum(dO * O)", CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
  g.Pointwise("D = rowsum * 1", CUDNN_POINTWISE_MUL, kF32, softmax_sum, do_o_sum, one);

  // P, recomputed from the forward's stats; then dV = P^T dO.
  const int64_t masked =
      CausalMask(g, ScaledScores(g, q, kt, scale, scores), scores, std::numeric_limits<float>::lowest());
  const int64_t shifted = g.Virtual("S - stats", kF32, scores);
  g.Pointwise("S - stats", CUDNN_POINTWISE_SUB, kF32, shifted, masked, t.stats);
  const int64_t p = g.Virtual("P", kF32, scores);
  const int64_t pt = g.Virtual("P^T", io, {key.B, key.NH, key.T, key.T}, transposed);
  g.Pointwise("P = exp", CUDNN_POINTWISE_EXP, kF32, p, shifted);
  g.Reshape("P^T", p, pt);
  g.Matmul("dV = P^T dO", pt, d_o, dv);

  // dS = (dO V^T - D) * P * scale; dK = dS^T Q.
  const int64_t dp = g.Virtual("dP = dO V^T", kF32, scores);
  const int64_t dp_centered = g.Virtual("dP - D", kF32, scores);
  const int64_t ds_unscaled = g.Virtual("(dP - D) * P", kF32, scores);
  const int64_t ds = g.Virtual("dS", kF32, scores);
  const int64_t dst = g.Virtual("dS^T", io, {key.B, key.NH, key.T, key.T}, transposed);
  g.Matmul("dP = dO V^T", d_o, vt, dp);
  g.Pointwise("dP - D", CUDNN_POINTWISE_SUB, kF32, dp_centered, dp, softmax_sum);
  g.Pointwise("(dP - D) * P", CUDNN_POINTWISE_MUL, kF32, ds_unscaled, dp_centered, p);
  g.Pointwise("dS = ... * scale", CUDNN_POINTWISE_MUL, kF32, ds, ds_unscaled, scale);
  g.Reshape("dS^T", ds, dst);
  g.Matmul("dK = dS^T Q", dst, q, dk);

  // dQ = dS K, accumulated in fp32, then converted.
  const SdpaView k_view = QkvView(s, QkvPart::kK);
  const int64_t k = g.Virtual("K", kF32, k_view.dims, k_view.strides);
  g.Reshape("K = (K^T)^T", kt, k);
  g.Matmul("dQ = dS K", ds, k, dq_accum);
  g.Pointwise("dQ = dQ accumulator", CUDNN_POINTWISE_IDENTITY, kF32, dq, dq_accum);
}

GraphBuilder DeclareGraph(const SdpaPlanKey& key) {
  GraphBuilder g("cuDNN SDPA " + key.ToString());
  if (key.pass == SdpaPass::kForward) {
    DeclareForward(g, key);
  } else {
    DeclareBackward(g, key);
  }
  return g;
}

}  // namespace

SdpaStatus BuildSdpaPlan(cudnnHandle_t handle, const SdpaPlanKey& key, cudnn_graph::Plan* plan) {
  GraphBuilder g = DeclareGraph(key);
  return g.Build(handle, plan);
}

SdpaStatus CheckSdpaGraph(const SdpaPlanKey& key) {
  GraphBuilder g = DeclareGraph(key);
  cudnn_graph::Desc graph;
  return g.FinalizeGraph(/*handle=*/nullptr, &graph);
}

}  // namespace strata::kernels::cuda
