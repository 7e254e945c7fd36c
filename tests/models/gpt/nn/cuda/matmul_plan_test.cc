// The host-side planning of the cuBLASLt products (models/gpt/nn/cuda/matmul_plan.h), without a GPU:
// - the row-major -> column-major mapping, by running each of nn.h's six products as cuBLASLt would
//   (a naive column-major GEMM with cuBLASLt's transposes, layouts, beta and bias epilogue, reading the
//   operands from the same buffers the device code passes) and comparing against the host kernels;
// - the plan key (what changes a plan and what must not), pointer alignment, the LRU plan cache, and the
//   bias-gradient chunking. Label unit; runs in every build.
#include "models/gpt/nn/cuda/matmul_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/nn/cpu/nn.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace strata::kernels::cuda {
namespace {

using cpu::testing::Uniform;
using Vec = std::vector<float>;

// A column-major matrix as cuBLASLt sees it: a layout over a caller's buffer. Each element read is
// bounds-checked against the buffer, so a wrong leading dimension or shape fails loudly.
struct ColumnMajorView {
  const float* data;
  size_t size;
  int64_t rows, cols, ld;
  double At(int64_t i, int64_t j) const {
    EXPECT_TRUE(i >= 0 && i < rows && j >= 0 && j < cols && ld >= rows) << "(" << i << "," << j << ")";
    const size_t idx = static_cast<size_t>(i + j * ld);
    EXPECT_LT(idx, size);
    return idx < size ? data[idx] : NAN;
  }
};

// D = op(A) @ op(B) + beta * C + bias (bias[i] on row i of D, cuBLASLt's CUBLASLT_EPILOGUE_BIAS), in
// double, written into the row-major buffer c of `c_size` elements (C and D are one buffer).
void ColumnMajorGemmReference(const ColumnMajorGemm& g, const Vec& a, const Vec& b, const float* bias, float beta,
                              Vec& c) {
  const ColumnMajorView A{a.data(), a.size(), g.a_rows, g.a_cols, g.lda};
  const ColumnMajorView B{b.data(), b.size(), g.b_rows, g.b_cols, g.ldb};
  ASSERT_EQ(g.c_rows, g.m);
  ASSERT_EQ(g.c_cols, g.n);
  ASSERT_EQ(g.trans_a ? g.a_cols : g.a_rows, g.m);
  ASSERT_EQ(g.trans_b ? g.b_rows : g.b_cols, g.n);
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        sum += (g.trans_a ? A.At(p, i) : A.At(i, p)) * (g.trans_b ? B.At(j, p) : B.At(p, j));
      }
      const size_t idx = static_cast<size_t>(i + j * g.ldc);
      ASSERT_LT(idx, c.size());
      if (beta != 0.0f) sum += c[idx];
      if (bias != nullptr) sum += bias[i];
      c[idx] = static_cast<float>(sum);
    }
  }
}

// Runs `p` through the mapping: column-major A is the product's Y operand and B its X (the Note).
void RunAsCublasLt(const RowMajorProduct& p, const Vec& x, const Vec& y, const float* bias, Vec& c) {
  ASSERT_EQ(p.x, x.data());
  ASSERT_EQ(p.y, y.data());
  ASSERT_EQ(p.c, c.data());
  ColumnMajorGemmReference(ToColumnMajor(p.gemm), y, x, bias, p.beta, c);
}

void ExpectClose(const Vec& want, const Vec& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::fabs(static_cast<double>(got[i]) - want[i]) <= 1e-5 * scale) continue;
    if (bad++ == 0) first << " first at [" << i << "]: expected " << want[i] << ", actual " << got[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements off;" << first.str();
}

struct Shape {
  int M, K, N;
};
const Shape kShapes[] = {{7, 65, 129}, {1, 1, 1}, {3, 5, 2}, {16, 33, 17}, {2, 1, 9}};

TEST(MatmulPlan, ColumnMajorMappingMatchesHostProducts) {
  uint32_t seed = 7;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N);
    const size_t mk = static_cast<size_t>(s.M) * s.K, kn = static_cast<size_t>(s.K) * s.N,
                 mn = static_cast<size_t>(s.M) * s.N;
    const Vec a = Uniform(mk, -1, 1, ++seed), w = Uniform(kn, -1, 1, ++seed), bt = Uniform(kn, -1, 1, ++seed);
    const Vec bias = Uniform(s.N, -1, 1, ++seed), dout = Uniform(mn, -1, 1, ++seed);
    const Vec out0 = Uniform(mn, -1, 1, ++seed), dw0 = Uniform(kn, -1, 1, ++seed);
    const Vec nan_mn(mn, NAN), nan_mk(mk, NAN);

    for (bool accumulate : {false, true}) {
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        Vec want = accumulate ? out0 : Vec(mn, 0.0f), got = accumulate ? out0 : nan_mn;
        cpu::MatmulForward(a.data(), w.data(), b, want.data(), s.M, s.K, s.N, accumulate);
        RunAsCublasLt(ForwardProduct(a.data(), w.data(), got.data(), s.M, s.K, s.N, accumulate), a, w, b, got);
        ExpectClose(want, got, std::string("forward") + (accumulate ? " +=" : "") + (b ? " bias" : ""));
      }
    }
    Vec da_want(mk), da_got = nan_mk, dw_want = dw0, dw_got = dw0;
    cpu::MatmulBackward(dout.data(), a.data(), w.data(), da_want.data(), dw_want.data(), nullptr, s.M, s.K, s.N);
    RunAsCublasLt(BackwardDataProduct(dout.data(), w.data(), da_got.data(), s.M, s.K, s.N), dout, w, nullptr, da_got);
    RunAsCublasLt(BackwardWeightProduct(dout.data(), a.data(), dw_got.data(), s.M, s.K, s.N), a, dout, nullptr, dw_got);
    ExpectClose(da_want, da_got, "da");
    ExpectClose(dw_want, dw_got, "dw");

    // The tied head: b[N,K] (bt read as N x K).
    Vec out_want(mn), out_got = nan_mn;
    cpu::MatmulTransBForward(a.data(), bt.data(), out_want.data(), s.M, s.K, s.N);
    RunAsCublasLt(TransBForwardProduct(a.data(), bt.data(), out_got.data(), s.M, s.K, s.N), a, bt, nullptr, out_got);
    ExpectClose(out_want, out_got, "transB forward");
    Vec tda_want(mk), tda_got = nan_mk, db_want = dw0, db_got = dw0;
    cpu::MatmulTransBBackward(dout.data(), a.data(), bt.data(), tda_want.data(), db_want.data(), s.M, s.K, s.N);
    RunAsCublasLt(TransBBackwardDataProduct(dout.data(), bt.data(), tda_got.data(), s.M, s.K, s.N), dout, bt, nullptr,
                  tda_got);
    RunAsCublasLt(TransBBackwardWeightProduct(dout.data(), a.data(), db_got.data(), s.M, s.K, s.N), dout, a, nullptr,
                  db_got);
    ExpectClose(tda_want, tda_got, "transB da");
    ExpectClose(db_want, db_got, "transB db");
  }
}

TEST(MatmulPlan, ColumnMajorLayoutsDescribeTheStoredMatrices) {
  // da = dout @ w^T with M=7, K=65, N=129: A = w (row-major 65 x 129, read transposed), B = dout.
  const ColumnMajorGemm g = ToColumnMajor(BackwardDataProduct(nullptr, nullptr, nullptr, 7, 65, 129).gemm);
  EXPECT_TRUE(g.trans_a);
  EXPECT_FALSE(g.trans_b);
  EXPECT_EQ(g.m, 65);
  EXPECT_EQ(g.n, 7);
  EXPECT_EQ(g.k, 129);
  EXPECT_EQ(g.a_rows, 129);  // w's row length: its column-major rows
  EXPECT_EQ(g.a_cols, 65);
  EXPECT_EQ(g.lda, 129);
  EXPECT_EQ(g.b_rows, 129);
  EXPECT_EQ(g.b_cols, 7);
  EXPECT_EQ(g.ldb, 129);
  EXPECT_EQ(g.c_rows, 65);
  EXPECT_EQ(g.c_cols, 7);
  EXPECT_EQ(g.ldc, 65);
}

TEST(MatmulPlan, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(PointerAlignment(0), 256u);
  EXPECT_EQ(PointerAlignment(1), 1u);
  EXPECT_EQ(PointerAlignment(6), 2u);
  EXPECT_EQ(PointerAlignment(48), 16u);
  EXPECT_EQ(PointerAlignment(256 * 3), 256u);
  EXPECT_EQ(PointerAlignment(uintptr_t{1} << 40), 256u);
}

TEST(MatmulPlan, KeyChangesWithShapeTypesAndAlignmentOnly) {
  const RowMajorGemm g = ForwardProduct(nullptr, nullptr, nullptr, 7, 65, 129, false).gemm;
  const MatmulKey base = MakeMatmulKey(g, kMatmulBf16, false, false, 0x1000, 0x2000, 0x3000, 0);
  // Other (equally aligned) pointers, and an unused bias type or pointer, share the plan.
  MatmulTypes other_bias = kMatmulBf16;
  other_bias.bias = MatmulDtype::kF32;
  EXPECT_EQ(base, MakeMatmulKey(g, other_bias, false, false, 0x5000, 0x6000, 0x7000, 0x8));
  EXPECT_EQ(base, MakeMatmulKey(g, kMatmulBf16, false, /*tf32=*/true, 0x1000, 0x2000, 0x3000, 0));  // bf16: no TF32
  // Everything the heuristic depends on makes another plan.
  EXPECT_NE(base, MakeMatmulKey(ForwardProduct(nullptr, nullptr, nullptr, 8, 65, 129, false).gemm, kMatmulBf16, false,
                                false, 0x1000, 0x2000, 0x3000, 0));
  EXPECT_NE(base, MakeMatmulKey(g, kMatmulBf16InF32Out, false, false, 0x1000, 0x2000, 0x3000, 0));
  EXPECT_NE(base, MakeMatmulKey(g, kMatmulBf16, true, false, 0x1000, 0x2000, 0x3000, 0x4000));
  EXPECT_NE(base, MakeMatmulKey(g, kMatmulBf16, false, false, 0x1002, 0x2000, 0x3000, 0));
  EXPECT_NE(base, MakeMatmulKey(g, kMatmulBf16, false, false, 0x1000, 0x2000, 0x3008, 0));
  EXPECT_NE(MakeMatmulKey(g, kMatmulF32, false, false, 0x1000, 0x2000, 0x3000, 0),
            MakeMatmulKey(g, kMatmulF32, false, true, 0x1000, 0x2000, 0x3000, 0));
  EXPECT_NE(MakeMatmulKey(g, kMatmulBf16, true, false, 0x1000, 0x2000, 0x3000, 0x4000),
            MakeMatmulKey(g, kMatmulBf16, true, false, 0x1000, 0x2000, 0x3000, 0x4010));
  // Column-major A is the row-major Y operand (w), B the X operand (a).
  EXPECT_EQ(base.align_a, 256u);
  EXPECT_EQ(MakeMatmulKey(g, kMatmulBf16, false, false, 0x1000, 0x2004, 0x3000, 0).align_a, 4u);
}

TEST(MatmulPlan, CacheEvictsTheLeastRecentlyUsedPlan) {
  const auto key = [](int64_t m) {
    return MakeMatmulKey(ForwardProduct(nullptr, nullptr, nullptr, m, 4, 4, false).gemm, kMatmulF32, false, false, 0, 0,
                         0, 0);
  };
  MatmulPlanCache<std::unique_ptr<int>> cache(2);
  EXPECT_EQ(cache.Find(key(1)), nullptr);
  cache.Insert(key(1), std::make_unique<int>(1));
  cache.Insert(key(2), std::make_unique<int>(2));
  ASSERT_NE(cache.Find(key(1)), nullptr);  // 1 is now more recent than 2
  cache.Insert(key(3), std::make_unique<int>(3));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Find(key(2)), nullptr);
  ASSERT_NE(cache.Find(key(1)), nullptr);
  EXPECT_EQ(**cache.Find(key(1)), 1);
  EXPECT_EQ(**cache.Find(key(3)), 3);
  cache.Insert(key(3), std::make_unique<int>(30));  // replaces in place
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(**cache.Find(key(3)), 30);
  EXPECT_EQ(MatmulPlanCache<int>(0).capacity(), 1u);
}

TEST(MatmulPlan, BiasGradChunksCoverEveryRowWithinTheWorkspace) {
  const size_t kBig = size_t{32} << 20;
  EXPECT_EQ(BiasGradChunks(0, 768, kBig), 1);
  EXPECT_EQ(BiasGradChunks(1, 768, kBig), 1);
  EXPECT_EQ(BiasGradChunks(8192, 768, kBig), 8192 / kBiasGradRowsPerChunk);
  EXPECT_EQ(BiasGradChunks(8192, 768, 0), 1);
  EXPECT_EQ(BiasGradChunks(8192, 768, 768 * sizeof(float) * 3 + 5), 3);  // what the workspace holds
  EXPECT_EQ(BiasGradChunks(int64_t{1} << 24, 1, kBig), kBiasGradMaxChunks);
  for (int64_t M : {1, 7, 64, 65, 129, 8192, 100000, 1 << 24}) {
    for (size_t ws : {size_t{0}, size_t{4096}, kBig}) {
      const int64_t N = 129, chunks = BiasGradChunks(M, N, ws), rows = BiasGradRowsPerChunk(M, chunks);
      EXPECT_GE(chunks, 1);
      EXPECT_GE(chunks * rows, M) << "M=" << M << " ws=" << ws;
      if (chunks > 1) {
        EXPECT_LE(static_cast<size_t>(chunks * N) * sizeof(float), ws);
      }
    }
  }
}

TEST(MatmulPlan, OnlyF32FactorsIntoBf16IsUnsupported) {
  EXPECT_TRUE(MatmulTypesSupported(kMatmulF32));
  EXPECT_TRUE(MatmulTypesSupported(kMatmulBf16InF32Out));
  EXPECT_TRUE(MatmulTypesSupported(kMatmulBf16));
  EXPECT_FALSE(MatmulTypesSupported({MatmulDtype::kF32, MatmulDtype::kBf16, MatmulDtype::kBf16}));
}

}  // namespace
}  // namespace strata::kernels::cuda
