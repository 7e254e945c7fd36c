// cuDNN's fused causal attention (models/gpt/nn/cuda/sdpa_cudnn.h) against the plain reference kernel
// (models/gpt/nn/cuda/attention.cuh, itself checked against the host in nn_cuda_test.cc), forward and backward,
// bf16 and fp16, T = 64, 128, 1024 with head dim 64 and 2 to 12 heads.
//
// Both sides see the same inputs: random values rounded to the 16-bit type, which the reference reads
// widened back to fp32, so input rounding is no part of the difference. What remains is cuDNN's own
// rounding: P (and dS) are rounded to the 16-bit type before the products that consume them, and the
// outputs are rounded to it (unit roundoff u = 2^-9 for bf16, 2^-12 for fp16). Bound per output element
// (fp32 accumulation, its error negligible next to u):
//   out  = sum_j P_j v_j, P_j rounded: |err| <= u sum_j P_j |v_j| + u |out| <= 2u max|v|;
//   dV, dK, dQ: the same argument on each product plus the rounding of the inputs O and dO that
//   rowsum(dO * O) is formed from, a few u of the output's scale.
// So every output is compared within 2e-2 of its scale (the largest |reference| value of that output):
// about 5x the 2u = 3.9e-3 worst case of bf16 (where errors of independent terms add up, they mostly
// cancel), and loose enough for accumulation-order differences over T = 1024 terms. The saved
// log-sum-exp statistics are compared within 1e-3 of max(1, scale): they are formed in fp32 from the same
// inputs on both sides. (These tolerances are argued, not yet measured: tune only with a reason.)
// The reference saves no log-sum-exp; the test derives it from the reference's probabilities: for each
// row, LSE = s_j - log(att_j) at the row's largest probability j (>= 1/(t+1), so the log is well
// conditioned), with s_j = q_t . k_j / sqrt(hd) in double.
//
// Needs a GPU (skips with the reason when none is visible) and a shape cuDNN supports there (skips with
// SdpaSupported's reason otherwise). Label gpu. The checks that need no GPU (cuDNN finalizing every
// descriptor and both operation graphs; the error text) run everywhere. When a graph is refused on a GPU,
// CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN print each engine's reason.
#include "models/gpt/nn/cuda/sdpa_cudnn.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "models/gpt/nn/cuda/attention.cuh"
#include "models/gpt/nn/cuda/cudnn_graph_util.h"
#include "models/gpt/nn/cuda/sdpa_cudnn_graph.h"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace strata::kernels::cuda {
namespace {

using cpu::testing::Uniform;
using testing::DeviceVec;
using Vec = std::vector<float>;
using Bits16 = std::vector<uint16_t>;

constexpr double kOutputRtol = 2e-2;  // of each output's scale (header comment)
constexpr double kStatsRtol = 1e-3;   // of max(1, stats scale)

#define ASSERT_SDPA_OK(expr)                                                \
  do {                                                                      \
    const SdpaStatus strata_st_ = (expr);                                   \
    ASSERT_TRUE(strata_st_.ok()) << #expr << ": " << strata_st_.ToString(); \
  } while (0)

uint16_t To16(float f, SdpaDtype dtype) { return dtype == SdpaDtype::kBf16 ? FloatToBf16(f) : FloatToHalf(f); }
float From16(uint16_t h, SdpaDtype dtype) { return dtype == SdpaDtype::kBf16 ? Bf16ToFloat(h) : HalfToFloat(h); }

// x rounded to the 16-bit type: its bits, and the values they hold widened back to fp32.
void Round16(const Vec& x, SdpaDtype dtype, Bits16* bits, Vec* widened) {
  bits->resize(x.size());
  widened->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    (*bits)[i] = To16(x[i], dtype);
    (*widened)[i] = From16((*bits)[i], dtype);
  }
}

Vec Widen(const Bits16& bits, SdpaDtype dtype) {
  Vec out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = From16(bits[i], dtype);
  return out;
}

// Every element of `got` within rtol * max(min_scale, max |want|) of `want`; reports the worst few.
void ExpectScaleClose(const Vec& want, const Vec& got, const std::string& what, double rtol, double min_scale = 0) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = min_scale;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  const double tol = rtol * scale;
  std::ostringstream msg;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    if (err <= tol) continue;  // NaN fails here too
    if (bad < 8) msg << "\n  " << what << "[" << i << "]: expected " << want[i] << ", actual " << got[i];
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements beyond " << tol << " (scale "
                     << scale << ", worst error " << worst << ")" << msg.str();
  ::testing::Test::RecordProperty(what + "_worst_error_over_scale", std::to_string(scale > 0 ? worst / scale : worst));
}

// The log-sum-exp of each scaled, masked score row, from the reference probabilities (header comment).
Vec ReferenceStats(const Vec& qkv, const Vec& att, const SdpaShape& s) {
  const int hd = s.HeadDim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Vec stats(static_cast<size_t>(s.B) * s.NH * s.T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        const size_t row = (static_cast<size_t>(b) * s.NH + h) * s.T + t;
        const float* a = att.data() + row * s.T;
        const int j = static_cast<int>(std::max_element(a, a + t + 1) - a);
        const float* q = qkv.data() + (static_cast<size_t>(b) * s.T + t) * 3 * s.C + h * hd;
        const float* k = qkv.data() + (static_cast<size_t>(b) * s.T + j) * 3 * s.C + s.C + h * hd;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
        stats[row] = static_cast<float>(scale * dot - std::log(static_cast<double>(a[j])));
      }
    }
  }
  return stats;
}

// Part p (0 q, 1 k, 2 v) of a [B, T, 3C] buffer, as [B, T, C].
Vec QkvPartOf(const Vec& x, const SdpaShape& s, int p) {
  Vec out;
  out.reserve(static_cast<size_t>(s.B) * s.T * s.C);
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; ++row) {
    out.insert(out.end(), x.begin() + row * 3 * s.C + p * s.C, x.begin() + row * 3 * s.C + (p + 1) * s.C);
  }
  return out;
}

struct Case {
  int B, T, NH, hd;
  SdpaDtype dtype;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(SdpaDtypeName(c.dtype)) + "_B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_NH" +
         std::to_string(c.NH) + "_hd" + std::to_string(c.hd);
}

class SdpaCudnnTest : public testing::CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped()) return;
    const SdpaStatus st = SdpaContext::Create(&ctx_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  std::unique_ptr<SdpaContext> ctx_;
};

// Skips the test, naming SdpaSupported's reason, when cuDNN cannot run this pass here.
#define SKIP_UNLESS_SUPPORTED(ctx, s, dtype, pass)                                       \
  do {                                                                                   \
    const SdpaStatus strata_sup_ = SdpaSupported(ctx, s, dtype, pass);                   \
    if (strata_sup_.code == SdpaCode::kUnsupported) GTEST_SKIP() << strata_sup_.message; \
    ASSERT_TRUE(strata_sup_.ok()) << strata_sup_.ToString();                             \
  } while (0)

class SdpaCudnnMatchesReference : public SdpaCudnnTest, public ::testing::WithParamInterface<Case> {};

TEST_P(SdpaCudnnMatchesReference, ForwardAndBackward) {
  const Case& c = GetParam();
  const SdpaShape s{c.B, c.T, c.NH * c.hd, c.NH};
  SKIP_UNLESS_SUPPORTED(*ctx_, s, c.dtype, SdpaPass::kForward);
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T, n_stats = static_cast<size_t>(s.B) * s.NH * s.T;
  Bits16 qkv16, dout16;
  Vec qkv, dout;
  // Scores q.k / 8 of spread ~1.3: rows neither uniform nor one-hot.
  Round16(Uniform(n_qkv, -2, 2, 1000 + c.T), c.dtype, &qkv16, &qkv);
  Round16(Uniform(n_out, -1, 1, 2000 + c.T), c.dtype, &dout16, &dout);

  // Reference (fp32 on the widened inputs).
  DeviceVec<float> r_qkv(qkv), r_dout(dout), r_out{Vec(n_out)}, r_att{Vec(n_att)}, r_dqkv{Vec(n_qkv)},
      r_datt{Vec(n_att)};
  ASSERT_TRUE(r_qkv.ok() && r_dout.ok() && r_out.ok() && r_att.ok() && r_dqkv.ok() && r_datt.ok());
  ASSERT_CUDA(LaunchAttentionForward(r_qkv.get(), r_out.get(), r_att.get(), s.B, s.T, s.C, s.NH, nullptr));
  ASSERT_CUDA(LaunchAttentionBackward(r_dout.get(), r_qkv.get(), r_att.get(), r_dqkv.get(), r_datt.get(), s.B, s.T, s.C,
                                      s.NH, nullptr));

  // cuDNN: the forward with the context's own workspace, the backward with the caller's.
  DeviceVec<uint16_t> d_qkv(qkv16), d_dout(dout16), d_out{Bits16(n_out)}, d_dqkv{Bits16(n_qkv)};
  DeviceVec<float> d_stats{Vec(n_stats)};
  ASSERT_TRUE(d_qkv.ok() && d_dout.ok() && d_out.ok() && d_dqkv.ok() && d_stats.ok());
  ASSERT_SDPA_OK(SdpaForward(*ctx_, c.dtype, s, d_qkv.get(), d_out.get(), d_stats.get(), nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const Vec att = r_att.Host();
  ExpectScaleClose(r_out.Host(), Widen(d_out.Host(), c.dtype), "out", kOutputRtol);
  ExpectScaleClose(ReferenceStats(qkv, att, s), d_stats.Host(), "stats", kStatsRtol, /*min_scale=*/1.0);

  SKIP_UNLESS_SUPPORTED(*ctx_, s, c.dtype, SdpaPass::kBackward);
  size_t ws_bytes = 0;
  ASSERT_SDPA_OK(SdpaWorkspaceBytes(*ctx_, s, c.dtype, SdpaPass::kBackward, &ws_bytes));
  DeviceVec<uint8_t> ws{std::vector<uint8_t>(ws_bytes + 1)};
  ASSERT_TRUE(ws.ok());
  ASSERT_SDPA_OK(SdpaBackward(*ctx_, c.dtype, s, d_dout.get(), d_qkv.get(), d_out.get(), d_stats.get(), d_dqkv.get(),
                              nullptr, SdpaWorkspace{ws.get(), ws_bytes}));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const Vec want = r_dqkv.Host(), got = Widen(d_dqkv.Host(), c.dtype);
  const char* names[] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p) ExpectScaleClose(QkvPartOf(want, s, p), QkvPartOf(got, s, p), names[p], kOutputRtol);
  EXPECT_EQ(ctx_->cached_plans(), 2u);
  // Again on the same workspace, as the next layer does: the fp32 dQ accumulator in it must start from
  // zero, or dq comes out with the first call's added (the backward's atomics need not repeat to the
  // bit, so against the reference again).
  ASSERT_SDPA_OK(SdpaBackward(*ctx_, c.dtype, s, d_dout.get(), d_qkv.get(), d_out.get(), d_stats.get(), d_dqkv.get(),
                              nullptr, SdpaWorkspace{ws.get(), ws_bytes}));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ExpectScaleClose(QkvPartOf(want, s, 0), QkvPartOf(Widen(d_dqkv.Host(), c.dtype), s, 0), "dq (second call)",
                   kOutputRtol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaCudnnMatchesReference,
                         ::testing::Values(Case{2, 64, 2, 64, SdpaDtype::kBf16}, Case{2, 128, 12, 64, SdpaDtype::kBf16},
                                           Case{1, 1024, 4, 64, SdpaDtype::kBf16}, Case{2, 128, 6, 64, SdpaDtype::kF16},
                                           Case{1, 1024, 2, 64, SdpaDtype::kF16}),
                         CaseName);

TEST_F(SdpaCudnnTest, UnsupportedHeadDimIsRefusedWithTheReason) {
  const SdpaShape s{1, 64, 24, 2};  // head dim 12
  const SdpaStatus st = SdpaSupported(*ctx_, s, SdpaDtype::kBf16, SdpaPass::kForward);
  EXPECT_EQ(st.code, SdpaCode::kUnsupported);
  EXPECT_NE(st.message.find("multiple of 8"), std::string::npos) << st.message;
  // The call itself says the same, before looking at the (here absent) buffers.
  EXPECT_EQ(SdpaForward(*ctx_, SdpaDtype::kBf16, s, nullptr, nullptr, nullptr, nullptr).code, SdpaCode::kUnsupported);
}

TEST_F(SdpaCudnnTest, BadPointersAndShortWorkspaceAreInvalidArguments) {
  const SdpaShape s{1, 64, 128, 2};
  SKIP_UNLESS_SUPPORTED(*ctx_, s, SdpaDtype::kBf16, SdpaPass::kForward);
  DeviceVec<uint16_t> qkv{Bits16(3 * 64 * 128 + 8)}, out{Bits16(64 * 128 + 8)};
  DeviceVec<float> stats{Vec(2 * 64 + 4)};
  ASSERT_TRUE(qkv.ok() && out.ok() && stats.ok());
  const SdpaStatus null_out = SdpaForward(*ctx_, SdpaDtype::kBf16, s, qkv.get(), nullptr, stats.get(), nullptr);
  EXPECT_EQ(null_out.code, SdpaCode::kInvalidArgument) << null_out.ToString();
  const SdpaStatus misaligned = SdpaForward(*ctx_, SdpaDtype::kBf16, s, qkv.get() + 1, out.get(), stats.get(), nullptr);
  EXPECT_EQ(misaligned.code, SdpaCode::kInvalidArgument) << misaligned.ToString();
  size_t bytes = 0;
  ASSERT_SDPA_OK(SdpaWorkspaceBytes(*ctx_, s, SdpaDtype::kBf16, SdpaPass::kForward, &bytes));
  if (bytes > 0) {
    DeviceVec<uint8_t> ws{std::vector<uint8_t>(bytes)};
    ASSERT_TRUE(ws.ok());
    const SdpaStatus shortws = SdpaForward(*ctx_, SdpaDtype::kBf16, s, qkv.get(), out.get(), stats.get(), nullptr,
                                           SdpaWorkspace{ws.get(), bytes - 1});
    EXPECT_EQ(shortws.code, SdpaCode::kInvalidArgument) << shortws.ToString();
  }
}

TEST_F(SdpaCudnnTest, EmptyInputsDoNothing) {
  ASSERT_SDPA_OK(SdpaForward(*ctx_, SdpaDtype::kBf16, {0, 64, 128, 2}, nullptr, nullptr, nullptr, nullptr));
  ASSERT_SDPA_OK(
      SdpaBackward(*ctx_, SdpaDtype::kBf16, {2, 0, 128, 2}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(ctx_->cached_plans(), 0u);
}

// ---- No GPU needed: cuDNN's own checks of the graphs, and the error text a GPU session would read.

// Every tensor and operation descriptor of both graphs, and the operation graphs themselves, pass
// cuDNN's finalization (shapes, data types, broadcasts, matmul dims) on any machine with the library.
TEST(SdpaCudnnGraphs, EveryDescriptorAndBothGraphsFinalizeWithoutAGpu) {
  for (const SdpaShape s : {SdpaShape{2, 64, 128, 2}, SdpaShape{1, 1024, 768, 12}, SdpaShape{3, 100, 512, 4}}) {
    for (const SdpaDtype dtype : {SdpaDtype::kBf16, SdpaDtype::kF16}) {
      for (const SdpaPass pass : {SdpaPass::kForward, SdpaPass::kBackward}) {
        const SdpaStatus st = CheckSdpaGraph(MakeSdpaPlanKey(s, dtype, pass));
        EXPECT_TRUE(st.ok()) << st.ToString();
      }
    }
  }
}

TEST(SdpaCudnnErrors, CudnnFailuresNameTheCallAndTheStatus) {
  const SdpaStatus unsupported = cudnn_graph::CudnnFailure(
      "graph X", "cudnnBackendFinalize", CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, /*unsupported_ok=*/true);
  EXPECT_EQ(unsupported.code, SdpaCode::kUnsupported);
  EXPECT_NE(unsupported.message.find("graph X: cudnnBackendFinalize: "), std::string::npos) << unsupported.message;
  EXPECT_NE(unsupported.message.find("(3001)"), std::string::npos) << unsupported.message;
  const SdpaStatus bad = cudnn_graph::CudnnFailure("graph X", "cudnnBackendSetAttribute(CUDNN_ATTR_TENSOR_STRIDES)",
                                                   CUDNN_STATUS_BAD_PARAM, /*unsupported_ok=*/true);
  EXPECT_EQ(bad.code, SdpaCode::kCudnnError);
  EXPECT_NE(bad.message.find("CUDNN_ATTR_TENSOR_STRIDES"), std::string::npos) << bad.message;
}

}  // namespace
}  // namespace strata::kernels::cuda
