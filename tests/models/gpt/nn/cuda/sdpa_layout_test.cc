// The host-only index math of the cuDNN attention path (models/gpt/nn/cuda/sdpa_layout.h): every element of the
// strided Q / K / V / O / stats views lands where models/gpt/nn/cpu/nn.h's layouts put it (Note [SDPA views]),
// the views tile their buffers exactly once, the shape rules say why a shape is refused, plan keys tell
// shapes apart, and the backward's workspace parts are aligned and disjoint; and the status names
// (sdpa_status.h), which live in the same library. Needs no GPU or cuDNN.
#include "models/gpt/nn/cuda/sdpa_layout.h"

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "gtest/gtest.h"

namespace strata::kernels::cuda {
namespace {

int64_t At(const SdpaView& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return v.offset_elems + i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] + i3 * v.strides[3];
}

// Calls f(b, h, t, d) for every element of a [B, NH, T, hd] tensor.
template <class F>
void ForEach(const SdpaShape& s, F f) {
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.HeadDim(); ++d) f(b, h, t, d);
}

// Odd batch and sequence, two heads of 8: small enough to enumerate, no size equal to another.
const SdpaShape kShape{3, 5, 16, 2};

TEST(SdpaLayout, QkvViewsAddressGptLayoutAndTileTheBufferOnce) {
  const SdpaShape& s = kShape;
  const int64_t C = s.C, hd = s.HeadDim();
  std::vector<int> hits(static_cast<size_t>(s.B) * s.T * 3 * C, 0);
  for (const QkvPart part : {QkvPart::kQ, QkvPart::kK, QkvPart::kV}) {
    const SdpaView v = QkvView(s, part);
    EXPECT_EQ(v.dims, (Dims4{s.B, s.NH, s.T, hd}));
    EXPECT_EQ(v.strides[3], 1) << "cuDNN needs unit stride along the head dimension";
    ForEach(s, [&](int b, int h, int t, int d) {
      const int64_t want = (static_cast<int64_t>(b) * s.T + t) * 3 * C + static_cast<int64_t>(part) * C + h * hd + d;
      ASSERT_EQ(At(v, b, h, t, d), want) << "part " << static_cast<int>(part) << " b=" << b << " h=" << h << " t=" << t
                                         << " d=" << d;
      ++hits[want];
    });
    EXPECT_EQ(ViewSpanElems(v), s.B * s.T * 3 * C - (2 - static_cast<int64_t>(part)) * C);
  }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "qkv element " << i;
}

TEST(SdpaLayout, TransposedViewsSwapTheLastTwoDims) {
  for (const QkvPart part : {QkvPart::kK, QkvPart::kV}) {
    const SdpaView v = QkvView(kShape, part), vt = QkvTransposedView(kShape, part);
    EXPECT_EQ(vt.dims, (Dims4{kShape.B, kShape.NH, kShape.HeadDim(), kShape.T}));
    EXPECT_EQ(vt.strides[2], 1);
    ForEach(kShape, [&](int b, int h, int t, int d) { ASSERT_EQ(At(vt, b, h, d, t), At(v, b, h, t, d)); });
  }
}

TEST(SdpaLayout, OutAndStatsViewsAddressTheirBuffers) {
  const SdpaShape& s = kShape;
  const SdpaView o = OutView(s);
  std::vector<int> hits(static_cast<size_t>(s.B) * s.T * s.C, 0);
  ForEach(s, [&](int b, int h, int t, int d) {
    const int64_t want = (static_cast<int64_t>(b) * s.T + t) * s.C + h * s.HeadDim() + d;
    ASSERT_EQ(At(o, b, h, t, d), want);
    ++hits[want];
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "out element " << i;
  EXPECT_EQ(ViewSpanElems(o), s.B * s.T * s.C);

  const SdpaView st = StatsView(s);
  EXPECT_EQ(st.dims, (Dims4{s.B, s.NH, s.T, 1}));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) ASSERT_EQ(At(st, b, h, t, 0), (b * s.NH + h) * s.T + t);
  EXPECT_EQ(ViewSpanElems(st), s.B * s.NH * s.T);
}

TEST(SdpaLayout, PartOffsetsKeep16ByteAlignmentForHeadDimsOfEight) {
  for (const SdpaShape s : {SdpaShape{1, 7, 8, 1}, SdpaShape{2, 64, 768, 12}, SdpaShape{1, 3, 24, 3}}) {
    for (const QkvPart part : {QkvPart::kK, QkvPart::kV}) {
      EXPECT_EQ(QkvView(s, part).offset_elems * 2 % 16, 0) << "C=" << s.C;
    }
  }
}

TEST(SdpaLayout, EmptyViewSpansNothing) { EXPECT_EQ(ViewSpanElems(OutView({0, 5, 16, 2})), 0); }

TEST(SdpaLayout, ShapeRulesSayWhy) {
  EXPECT_TRUE(CheckSdpaShape({4, 1024, 768, 12}).ok());  // GPT-2 small
  EXPECT_TRUE(CheckSdpaShape({1, 1, 512, 2}).ok());      // head dim 256, the largest
  for (const SdpaShape s : {SdpaShape{0, 4, 64, 1}, SdpaShape{1, 0, 64, 1}, SdpaShape{1, 4, -64, 1},
                            SdpaShape{1, 4, 64, 0}, SdpaShape{1, 4, 64, 3}}) {
    const SdpaStatus st = CheckSdpaShape(s);
    EXPECT_EQ(st.code, SdpaCode::kInvalidArgument) << st.ToString();
  }
  const SdpaStatus odd = CheckSdpaShape({1, 4, 24, 2});  // hd = 12
  EXPECT_EQ(odd.code, SdpaCode::kUnsupported);
  EXPECT_NE(odd.message.find("multiple of 8"), std::string::npos) << odd.message;
  const SdpaStatus big = CheckSdpaShape({1, 4, 528, 2});  // hd = 264
  EXPECT_EQ(big.code, SdpaCode::kUnsupported);
  EXPECT_NE(big.message.find("256"), std::string::npos) << big.message;
}

TEST(SdpaLayout, StatusesNameTheirCode) {
  EXPECT_EQ(SdpaStatus::Ok().ToString(), "kOk");
  EXPECT_EQ(SdpaStatus::Error(SdpaCode::kCudaError, "x").ToString(), "kCudaError: x");
  EXPECT_STREQ(SdpaCodeName(SdpaCode::kResourceExhausted), "kResourceExhausted");
}

TEST(SdpaLayout, PlanKeysTellShapesDtypesAndPassesApart) {
  std::unordered_set<SdpaPlanKey, SdpaPlanKeyHash> keys;
  for (const SdpaShape s : {SdpaShape{4, 1024, 768, 12}, SdpaShape{4, 512, 768, 12}, SdpaShape{2, 1024, 768, 12},
                            SdpaShape{4, 1024, 768, 6}, SdpaShape{4, 1024, 1536, 12}}) {
    for (const SdpaDtype dtype : {SdpaDtype::kBf16, SdpaDtype::kF16}) {
      for (const SdpaPass pass : {SdpaPass::kForward, SdpaPass::kBackward}) {
        EXPECT_TRUE(keys.insert(MakeSdpaPlanKey(s, dtype, pass)).second);
        EXPECT_FALSE(keys.insert(MakeSdpaPlanKey(s, dtype, pass)).second) << "the same key again";
      }
    }
  }
  EXPECT_EQ(keys.size(), 20u);
  const SdpaPlanKey k = MakeSdpaPlanKey({4, 1024, 768, 12}, SdpaDtype::kBf16, SdpaPass::kBackward);
  EXPECT_EQ(k.head_dim, 64);
  EXPECT_EQ(k.ToString(), "backward bf16 B=4 NH=12 T=1024 hd=64");
  EXPECT_EQ(SdpaPlanKeyHash{}(k),
            SdpaPlanKeyHash{}(MakeSdpaPlanKey({4, 1024, 768, 12}, SdpaDtype::kBf16, SdpaPass::kBackward)));
}

TEST(SdpaLayout, ForwardWorkspaceIsThePlansRoundedUp) {
  const SdpaPlanKey k = MakeSdpaPlanKey({2, 64, 128, 2}, SdpaDtype::kBf16, SdpaPass::kForward);
  EXPECT_EQ(SdpaWorkspaceLayoutOf(k, 0).total_bytes, 0u);
  EXPECT_EQ(SdpaWorkspaceLayoutOf(k, 1).total_bytes, kSdpaScratchAlign);
  EXPECT_EQ(SdpaWorkspaceLayoutOf(k, 1000).total_bytes, 1024u);
}

TEST(SdpaLayout, BackwardWorkspacePartsAreAlignedAndDisjoint) {
  const SdpaShape s{3, 65, 24 * 8, 3};  // odd T: the row sums are not a multiple of 256 bytes
  const SdpaPlanKey k = MakeSdpaPlanKey(s, SdpaDtype::kF16, SdpaPass::kBackward);
  for (const int64_t plan_bytes : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{123457}}) {
    const SdpaWorkspaceLayout l = SdpaWorkspaceLayoutOf(k, plan_bytes);
    const size_t sums = static_cast<size_t>(s.B) * s.NH * s.T * sizeof(float);
    EXPECT_GE(l.softmax_sum_offset, static_cast<size_t>(plan_bytes));
    EXPECT_GE(l.dq_accum_offset, l.softmax_sum_offset + sums);
    EXPECT_EQ(l.dq_accum_bytes, static_cast<size_t>(s.B) * s.T * s.C * sizeof(float));
    EXPECT_GE(l.total_bytes, l.dq_accum_offset + l.dq_accum_bytes);
    EXPECT_EQ(l.softmax_sum_offset % kSdpaScratchAlign, 0u);
    EXPECT_EQ(l.dq_accum_offset % kSdpaScratchAlign, 0u);
    EXPECT_EQ(l.total_bytes % kSdpaScratchAlign, 0u);
  }
}

}  // namespace
}  // namespace strata::kernels::cuda
