// The cuBLASLt products (models/gpt/nn/cuda/matmul.h) against their host twins in models/gpt/nn/cpu/nn.h (oneDNN
// sgemm, itself checked against double references in tests/models/gpt/nn/cpu/nn_test.cc), for every supported
// element-type combination, on random inputs in [-1, 1) of odd shapes (M=7, K=65, N=129; 1x1x1; 33x64x17)
// and a GPT-2-like one (M=256, K=768, N=2304), with bias, accumulate, the backward sums and empty products.
//
// Tolerances, each relative to the output's scale (the largest |host value|, at least 1):
// - fp32 factors (TF32 off): 1e-5. Both sides sum the same fp32 products in fp32, in other orders; on
//   these sizes that moves an element by well under 1e-6 of scale.
// - bf16 factors: the host multiplies the very same values (inputs rounded to bf16 on the host first),
//   and a product of two bf16 values is exact in fp32, so only the summation differs: order, and the
//   tensor cores' fp32 accumulation, which aligns addends by truncation rather than rounding to nearest.
//   Its error grows like K * 2^-23 * sum |terms| at worst (about 5e-4 of scale at K = 768 here, far less
//   in practice), so 1e-3.
// - bf16 destinations additionally lose the final rounding to bf16 (half an ulp, 2^-8 of the element),
//   twice when the bias is added by the separate kernel (Note [Fused bias]): 2^-7 of the element.
// Accumulated outputs start from the same random prefill on both sides (rounded to the destination's
// type); written outputs start as NaN on the device. Needs a GPU: skips with the reason when none is
// visible. Label gpu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "models/gpt/nn/cpu/nn.h"
#include "models/gpt/nn/cuda/matmul.h"
#include "models/gpt/nn/cuda/matmul_rate.cuh"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace strata::kernels::cuda {
namespace {

using cpu::testing::Uniform;
using testing::DeviceVec;
using Vec = std::vector<float>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kF32Rtol = 1e-5;          // of scale, fp32 factors (header comment)
constexpr double kBf16Rtol = 1e-3;         // of scale, bf16 factors
constexpr double kBf16OutRel = 1.0 / 128;  // of the element, bf16 destinations

Vec RoundedTo(MatmulDtype t, Vec v) {
  if (t == MatmulDtype::kBf16) {
    for (float& f : v) f = Bf16ToFloat(FloatToBf16(f));
  }
  return v;
}

std::vector<uint16_t> Bf16Bits(const Vec& v) {
  std::vector<uint16_t> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](float f) { return FloatToBf16(f); });
  return out;
}

// A device copy of a host vector stored as fp32 or bf16 (rounded to nearest even), with `pad` spare
// elements in front to shift its alignment.
class TypedDeviceVec {
 public:
  TypedDeviceVec(const Vec& host, MatmulDtype t, size_t pad = 0)
      : type_(t),
        f32_(t == MatmulDtype::kF32 ? host : Vec{}, pad),
        bf16_(t == MatmulDtype::kBf16 ? Bf16Bits(host) : std::vector<uint16_t>{}, pad) {}
  void* get() { return type_ == MatmulDtype::kF32 ? static_cast<void*>(f32_.get()) : bf16_.get(); }
  bool ok() const { return f32_.ok() && bf16_.ok(); }
  Vec Host() {
    if (type_ == MatmulDtype::kF32) return f32_.Host();
    const std::vector<uint16_t> bits = bf16_.Host();
    Vec out(bits.size());
    std::transform(bits.begin(), bits.end(), out.begin(), [](uint16_t h) { return Bf16ToFloat(h); });
    return out;
  }

 private:
  MatmulDtype type_;
  DeviceVec<float> f32_;
  DeviceVec<uint16_t> bf16_;
};

// |got - want| <= rtol * max(scale, 1) + element_rel * |want| for every element (NaN never passes);
// reports the first mismatches with index, expected and actual.
void ExpectNear(const Vec& want, const Vec& got, const std::string& what, double rtol, double element_rel) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  std::ostringstream msg;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = rtol * scale + element_rel * std::fabs(want[i]);
    if (std::fabs(static_cast<double>(got[i]) - want[i]) <= tol) continue;
    if (bad++ < 8) msg << "\n  " << what << "[" << i << "]: expected " << want[i] << ", actual " << got[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements off (scale " << scale << ")"
                     << msg.str();
}

// The comparison for a destination of type `out` from factors of type `in`.
void ExpectProductNear(const Vec& want, const Vec& got, const std::string& what, const MatmulTypes& t,
                       MatmulDtype out) {
  ExpectNear(want, got, what, t.in == MatmulDtype::kF32 ? kF32Rtol : kBf16Rtol,
             out == MatmulDtype::kBf16 ? kBf16OutRel : 0.0);
}

#define ASSERT_MM_OK(expr)                                             \
  do {                                                                 \
    const MatmulStatus strata_s_ = (expr);                             \
    ASSERT_TRUE(strata_s_.ok()) << #expr << ": " << strata_s_.message; \
  } while (0)

// A context over a 32 MiB workspace (skips with the fixture's reason when there is no GPU).
class MatmulCudaFixture : public testing::CudaDeviceTest {
 protected:
  void SetUp() override {
    testing::CudaDeviceTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_CUDA(cudaMalloc(&workspace_, kMatmulRecommendedWorkspaceBytes));
    ASSERT_MM_OK(MatmulContext::Create(workspace_, kMatmulRecommendedWorkspaceBytes, MatmulOptions{}, &ctx_));
  }
  void TearDown() override {
    ctx_.reset();
    cudaFree(workspace_);
  }
  void* workspace_ = nullptr;
  std::unique_ptr<MatmulContext> ctx_;
};

struct Shape {
  int M, K, N;
  size_t mk() const { return static_cast<size_t>(M) * K; }
  size_t kn() const { return static_cast<size_t>(K) * N; }
  size_t mn() const { return static_cast<size_t>(M) * N; }
};
const Shape kShapes[] = {{7, 65, 129}, {1, 1, 1}, {33, 64, 17}, {256, 768, 2304}};

// Every product of one shape and type combination: host twin of the rounded inputs vs the device.
struct Inputs {
  Vec a, w, bt, bias, dout, out0, dw0, dbias0;
};

Inputs MakeInputs(const Shape& s, const MatmulTypes& t, uint32_t seed) {
  const size_t mk = s.mk(), kn = s.kn(), mn = s.mn();
  Inputs in;
  in.a = RoundedTo(t.in, Uniform(mk, -1, 1, seed + 1));
  in.w = RoundedTo(t.in, Uniform(kn, -1, 1, seed + 2));
  in.bt = RoundedTo(t.in, Uniform(kn, -1, 1, seed + 3));  // the tied head's b[N,K]
  in.dout = RoundedTo(t.in, Uniform(mn, -1, 1, seed + 4));
  in.bias = RoundedTo(t.bias, Uniform(s.N, -1, 1, seed + 5));
  in.out0 = RoundedTo(t.out, Uniform(mn, -1, 1, seed + 6));
  in.dw0 = RoundedTo(t.out, Uniform(kn, -1, 1, seed + 7));
  in.dbias0 = RoundedTo(t.bias, Uniform(s.N, -1, 1, seed + 8));
  return in;
}

// Runs body(shape, inputs) for each of kShapes with inputs of the parameter's types (a fatal failure
// ends that shape only), the shape in every failure's trace.
class MatmulCudaTest : public MatmulCudaFixture, public ::testing::WithParamInterface<MatmulTypes> {
 protected:
  template <class Body>
  void ForEachShape(uint32_t seed, Body body) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(::testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N);
      body(s, MakeInputs(s, GetParam(), seed += 10));
    }
  }
};

std::string TypesName(const ::testing::TestParamInfo<MatmulTypes>& info) {
  const MatmulTypes& t = info.param;
  return std::string("In") + MatmulDtypeName(t.in) + "Out" + MatmulDtypeName(t.out) + "Bias" + MatmulDtypeName(t.bias);
}

TEST_P(MatmulCudaTest, ForwardWithBiasAndAccumulateMatchesHost) {
  const MatmulTypes t = GetParam();
  ForEachShape(1000, [&](const Shape& s, const Inputs& in) {
    TypedDeviceVec d_a(in.a, t.in), d_w(in.w, t.in), d_bias(in.bias, t.bias);
    ASSERT_ALL_OK(d_a.ok(), d_w.ok(), d_bias.ok());
    for (bool accumulate : {false, true}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "accumulate=" << accumulate << " bias=" << with_bias);
        const float* bias = with_bias ? in.bias.data() : nullptr;
        Vec want = in.out0;
        cpu::MatmulForward(in.a.data(), in.w.data(), bias, want.data(), s.M, s.K, s.N, accumulate);
        TypedDeviceVec d_out(accumulate ? in.out0 : Vec(s.mn(), kNaN), t.out);
        ASSERT_TRUE(d_out.ok());
        ASSERT_MM_OK(MatmulForward(*ctx_, d_a.get(), d_w.get(), with_bias ? d_bias.get() : nullptr, d_out.get(), s.M,
                                   s.K, s.N, accumulate, t, nullptr));
        ASSERT_CUDA(cudaDeviceSynchronize());
        ExpectProductNear(want, d_out.Host(), "out", t, t.out);
      }
    }
  });
}

TEST_P(MatmulCudaTest, BackwardMatchesHostAndSumsAreDeterministic) {
  const MatmulTypes t = GetParam();
  ForEachShape(2000, [&](const Shape& s, const Inputs& in) {
    Vec da(s.mk()), dw = in.dw0, dbias = in.dbias0;
    cpu::MatmulBackward(in.dout.data(), in.a.data(), in.w.data(), da.data(), dw.data(), dbias.data(), s.M, s.K, s.N);

    TypedDeviceVec d_dout(in.dout, t.in), d_a(in.a, t.in), d_w(in.w, t.in), d_da(Vec(s.mk(), kNaN), t.out),
        d_dw(in.dw0, t.out), d_dbias(in.dbias0, t.bias), d_dw2(in.dw0, t.out), d_dbias2(in.dbias0, t.bias);
    ASSERT_ALL_OK(d_dout.ok(), d_a.ok(), d_w.ok(), d_da.ok(), d_dw.ok(), d_dbias.ok(), d_dw2.ok(), d_dbias2.ok());
    ASSERT_MM_OK(MatmulBackwardData(*ctx_, d_dout.get(), d_w.get(), d_da.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_MM_OK(
        MatmulBackwardWeight(*ctx_, d_dout.get(), d_a.get(), d_dw.get(), d_dbias.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_MM_OK(
        MatmulBackwardWeight(*ctx_, d_dout.get(), d_a.get(), d_dw2.get(), d_dbias2.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectProductNear(da, d_da.Host(), "da", t, t.out);
    ExpectProductNear(dw, d_dw.Host(), "dw", t, t.out);
    // Column sums of exactly representable values, in fp32 on the device and double on the host.
    ExpectNear(dbias, d_dbias.Host(), "dbias", kF32Rtol, t.bias == MatmulDtype::kBf16 ? kBf16OutRel : 0.0);
    cpu::testing::ExpectBitEqual(d_dw.Host(), d_dw2.Host(), "dw, second run");
    cpu::testing::ExpectBitEqual(d_dbias.Host(), d_dbias2.Host(), "dbias, second run");
  });
}

TEST_P(MatmulCudaTest, TiedHeadForwardAndBackwardMatchHost) {
  const MatmulTypes t = GetParam();
  ForEachShape(3000, [&](const Shape& s, const Inputs& in) {
    Vec out(s.mn()), da(s.mk()), db = in.dw0;  // db[N,K] has the size of dw[K,N]
    cpu::MatmulTransBForward(in.a.data(), in.bt.data(), out.data(), s.M, s.K, s.N);
    cpu::MatmulTransBBackward(in.dout.data(), in.a.data(), in.bt.data(), da.data(), db.data(), s.M, s.K, s.N);

    TypedDeviceVec d_a(in.a, t.in), d_b(in.bt, t.in), d_dout(in.dout, t.in), d_out(Vec(s.mn(), kNaN), t.out),
        d_da(Vec(s.mk(), kNaN), t.out), d_db(in.dw0, t.out);
    ASSERT_ALL_OK(d_a.ok(), d_b.ok(), d_dout.ok(), d_out.ok(), d_da.ok(), d_db.ok());
    ASSERT_MM_OK(MatmulTransBForward(*ctx_, d_a.get(), d_b.get(), d_out.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_MM_OK(MatmulTransBBackwardData(*ctx_, d_dout.get(), d_b.get(), d_da.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_MM_OK(MatmulTransBBackwardWeight(*ctx_, d_dout.get(), d_a.get(), d_db.get(), s.M, s.K, s.N, t, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectProductNear(out, d_out.Host(), "out", t, t.out);
    ExpectProductNear(da, d_da.Host(), "da", t, t.out);
    ExpectProductNear(db, d_db.Host(), "db", t, t.out);
  });
}

// bf16 factors with an fp32 destination and a bf16 bias takes the separate bias kernel (Note [Fused bias]).
INSTANTIATE_TEST_SUITE_P(Types, MatmulCudaTest,
                         ::testing::Values(kMatmulF32, kMatmulBf16InF32Out, kMatmulBf16,
                                           MatmulTypes{MatmulDtype::kBf16, MatmulDtype::kF32, MatmulDtype::kBf16}),
                         TypesName);

using MatmulCudaContextTest = MatmulCudaFixture;

TEST_F(MatmulCudaContextTest, RepeatedProductsReuseTheirPlan) {
  const Shape s{33, 64, 17};
  const Inputs in = MakeInputs(s, kMatmulBf16, 4000);
  TypedDeviceVec d_a(in.a, MatmulDtype::kBf16), d_w(in.w, MatmulDtype::kBf16), d_out(in.out0, MatmulDtype::kBf16),
      d_out2(in.out0, MatmulDtype::kBf16);
  ASSERT_ALL_OK(d_a.ok(), d_w.ok(), d_out.ok(), d_out2.ok());
  ASSERT_MM_OK(
      MatmulForward(*ctx_, d_a.get(), d_w.get(), nullptr, d_out.get(), s.M, s.K, s.N, false, kMatmulBf16, nullptr));
  const uint64_t calls = ctx_->heuristic_calls();
  EXPECT_GE(calls, 1u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_MM_OK(
        MatmulForward(*ctx_, d_a.get(), d_w.get(), nullptr, d_out2.get(), s.M, s.K, s.N, false, kMatmulBf16, nullptr));
  }
  EXPECT_EQ(ctx_->heuristic_calls(), calls) << "same shape, types and alignment: no new heuristic query";
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(Bf16Bits(d_out.Host()), Bf16Bits(d_out2.Host())) << "same plan, same bits";
}

TEST_F(MatmulCudaContextTest, MisalignedOperandsAndBiasStillMatchHost) {
  // fp32 operands 4 bytes off a 16-byte boundary (the bias then takes the add kernel), bf16 ones 16 bytes
  // off 256 (a plan of its own: the alignments are part of the key).
  const Shape s{7, 65, 129};
  for (const auto& [t, pad] : {std::pair{kMatmulF32, size_t{1}}, std::pair{kMatmulBf16, size_t{8}}}) {
    SCOPED_TRACE(::testing::Message() << "in=" << MatmulDtypeName(t.in) << " pad=" << pad);
    const Inputs in = MakeInputs(s, t, 5000);
    Vec want = in.out0;
    cpu::MatmulForward(in.a.data(), in.w.data(), in.bias.data(), want.data(), s.M, s.K, s.N, true);
    TypedDeviceVec d_a(in.a, t.in, pad), d_w(in.w, t.in, pad), d_bias(in.bias, t.bias, pad), d_out(in.out0, t.out, pad);
    ASSERT_ALL_OK(d_a.ok(), d_w.ok(), d_bias.ok(), d_out.ok());
    ASSERT_MM_OK(
        MatmulForward(*ctx_, d_a.get(), d_w.get(), d_bias.get(), d_out.get(), s.M, s.K, s.N, true, t, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectProductNear(want, d_out.Host(), "out", t, t.out);
  }
}

TEST_F(MatmulCudaContextTest, EmptyProductsFollowTheHostRules) {
  const MatmulTypes t = kMatmulF32;
  const Vec bias = Uniform(5, -1, 1, 6001), out0 = Uniform(15, -1, 1, 6002);
  TypedDeviceVec d_bias(bias, t.bias), d_out(Vec(15, kNaN), t.out), d_acc(out0, t.out), d_da(Vec(15, kNaN), t.out);
  ASSERT_ALL_OK(d_bias.ok(), d_out.ok(), d_acc.ok(), d_da.ok());
  // K = 0: out = bias (written) and out += bias (accumulated); the factors are never read.
  ASSERT_MM_OK(MatmulForward(*ctx_, nullptr, nullptr, d_bias.get(), d_out.get(), 3, 0, 5, false, t, nullptr));
  ASSERT_MM_OK(MatmulForward(*ctx_, nullptr, nullptr, d_bias.get(), d_acc.get(), 3, 0, 5, true, t, nullptr));
  // da[3,5] = dout[3,0] @ w[5,0]^T: zeros. M = 0 and N = 0 elsewhere: nothing to do.
  ASSERT_MM_OK(MatmulBackwardData(*ctx_, nullptr, nullptr, d_da.get(), 3, 5, 0, t, nullptr));
  ASSERT_MM_OK(MatmulBackwardWeight(*ctx_, nullptr, nullptr, d_acc.get(), d_bias.get(), 0, 3, 5, t, nullptr));
  ASSERT_MM_OK(MatmulTransBForward(*ctx_, nullptr, nullptr, nullptr, 0, 4, 4, t, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  Vec want_out(15), want_acc = out0, want_da(15, kNaN);
  cpu::MatmulForward(nullptr, nullptr, bias.data(), want_out.data(), 3, 0, 5, false);
  cpu::MatmulForward(nullptr, nullptr, bias.data(), want_acc.data(), 3, 0, 5, true);
  cpu::MatmulBackward(nullptr, nullptr, nullptr, want_da.data(), nullptr, nullptr, 3, 5, 0);
  cpu::testing::ExpectBitEqual(want_out, d_out.Host(), "out, K = 0");
  cpu::testing::ExpectBitEqual(want_acc, d_acc.Host(), "accumulated out, K = 0");
  cpu::testing::ExpectBitEqual(want_da, d_da.Host(), "da, N = 0");
  cpu::testing::ExpectBitEqual(bias, d_bias.Host(), "dbias, M = 0");
}

TEST_F(MatmulCudaContextTest, BadArgumentsAreRejected) {
  int dummy = 0;
  MatmulStatus s = MatmulForward(*ctx_, &dummy, &dummy, nullptr, &dummy, 2, 2, 2, false,
                                 MatmulTypes{MatmulDtype::kF32, MatmulDtype::kBf16, MatmulDtype::kF32}, nullptr);
  EXPECT_EQ(s.code, MatmulCode::kInvalidArgument) << s.message;
  s = MatmulForward(*ctx_, &dummy, &dummy, nullptr, &dummy, -1, 2, 2, false, kMatmulF32, nullptr);
  EXPECT_EQ(s.code, MatmulCode::kInvalidArgument) << s.message;
  s = MatmulForward(*ctx_, nullptr, &dummy, nullptr, &dummy, 2, 2, 2, false, kMatmulF32, nullptr);
  EXPECT_EQ(s.code, MatmulCode::kInvalidArgument) << s.message;
  EXPECT_EQ(ctx_->heuristic_calls(), 0u);
}

TEST_F(MatmulCudaContextTest, Bf16RateIsMeasured) {
  double flops = 0.0;
  ASSERT_MM_OK(MeasureBf16MatmulFlops(*ctx_, 2048, 2048, 2048, 10, nullptr, &flops));
  std::cout << "dense bf16 matmul rate (2048^3, fp32 accumulation): " << flops / 1e12 << " TFLOP/s\n";
  RecordProperty("bf16_tflops", std::to_string(flops / 1e12));
  EXPECT_GT(flops, 1e12) << "any tensor-core GPU (sm_80 or later) exceeds 1 TFLOP/s in bf16";
}

}  // namespace
}  // namespace strata::kernels::cuda
