// Each CUDA kernel (kernels/cuda) against the scalar host reference (kernels/cpu ScalarKernels): bit for
// bit for the optimizers, casts, scale and the non-finite count; within the stated bound for the sum of
// squares (a different, but deterministic, order). Sizes 0, 1, 7, 4099 and ~3 million, at aligned,
// unaligned and mutually misaligned starts (the last takes the element-by-element path).
// Needs a GPU: skips with the reason when none is visible. Label gpu.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/non_finite.cuh"
#include "kernels/cuda/scale.cuh"
#include "kernels/cuda/sgd.cuh"
#include "kernels/cuda/sum_squares.cuh"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace strata::kernels::cuda {
namespace {

using cpu::ScalarKernels;
using cpu::testing::ExpectBitEqual;
using cpu::testing::RandomBits;
using cpu::testing::TestSizes;
using cpu::testing::Uniform;

using testing::DeviceVec;

class CudaKernelsTest : public testing::CudaDeviceTest {};

struct Host {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> copy;
};

Host MakeHost(size_t n) {
  return Host{Uniform(n, -1, 1, 1), Uniform(n, -2, 2, 2), Uniform(n, -0.1f, 0.1f, 3), Uniform(n, 0, 0.01f, 4),
              std::vector<uint16_t>(n, 0x5a5a)};
}

// Runs `op` on the host reference and on the device (arrays shifted by `pads`), compares everything.
template <class HostOp, class DeviceOp>
void CompareOptimizer(size_t n, const size_t (&pads)[5], ParamCopy copy, HostOp host_op, DeviceOp device_op,
                      const std::string& what) {
  Host want = MakeHost(n);
  DeviceVec<float> dp(want.master, pads[0]), dg(want.grad, pads[1]), dm(want.m, pads[2]), dv(want.v, pads[3]);
  DeviceVec<uint16_t> dc(want.copy, pads[4]);
  ASSERT_TRUE(dp.ok() && dg.ok() && dm.ok() && dv.ok() && dc.ok()) << what << ": cudaMalloc/cudaMemcpy failed";
  host_op(OptimizerArrays{want.master.data(), want.grad.data(), want.m.data(), want.v.data(), want.copy.data(), copy});
  ASSERT_CUDA(device_op(OptimizerArrays{dp.get(), dg.get(), dm.get(), dv.get(), dc.get(), copy}));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ExpectBitEqual(want.master, dp.Host(), what + " master");
  ExpectBitEqual(want.m, dm.Host(), what + " m");
  ExpectBitEqual(want.v, dv.Host(), what + " v");
  ExpectBitEqual(want.copy, dc.Host(), what + " param copy");
}

constexpr size_t kAligned[5] = {0, 0, 0, 0, 0};
constexpr size_t kShifted[5] = {3, 3, 3, 3, 3};     // same phase: scalar head, then 16-byte vectors
constexpr size_t kMisaligned[5] = {0, 1, 0, 2, 0};  // different phases: element by element

TEST_F(CudaKernelsTest, AdamWMatchesHostScalarBitForBit) {
  const AdamWCoeffs<float> c = AdamWCoeffsOf(MakeAdamWStep(1e-3, 0.9, 0.999, 1e-8, 0.01, 3));
  for (size_t n : TestSizes()) {
    for (ParamCopy copy : {ParamCopy::kNone, ParamCopy::kBf16, ParamCopy::kF16}) {
      for (const auto* pads : {&kAligned, &kShifted, &kMisaligned}) {
        const size_t begin = n > 2 ? 2 : 0;
        CompareOptimizer(
            n, *pads, copy, [&](const OptimizerArrays& a) { ScalarKernels().adamw(a, begin, n, c, 0.75f); },
            [&](const OptimizerArrays& a) { return LaunchAdamW(a, begin, n, c, 0.75f, nullptr); },
            "adamw n=" + std::to_string(n) + " copy=" + std::to_string(static_cast<int>(copy)) + " pads=" +
                std::to_string((*pads)[1]));
      }
    }
  }
}

TEST_F(CudaKernelsTest, SgdMatchesHostScalarBitForBit) {
  const SgdStep step{0.05f, 0.9f, 1e-4f};
  for (size_t n : TestSizes()) {
    for (const auto* pads : {&kAligned, &kShifted, &kMisaligned}) {
      CompareOptimizer(
          n, *pads, ParamCopy::kBf16, [&](const OptimizerArrays& a) { ScalarKernels().sgd(a, 0, n, step, 2.0f); },
          [&](const OptimizerArrays& a) { return LaunchSgd(a, 0, n, step, 2.0f, nullptr); },
          "sgd n=" + std::to_string(n) + " pads=" + std::to_string((*pads)[1]));
    }
  }
}

TEST_F(CudaKernelsTest, CastsAndScaleMatchHostScalarBitForBit) {
  for (size_t n : TestSizes()) {
    for (size_t pad : {size_t{0}, size_t{1}}) {
      const std::vector<float> x = RandomBits(n, 17);
      std::vector<uint16_t> bf(n), hf(n);
      std::vector<float> scaled(n);
      ScalarKernels().cast_bf16(x.data(), bf.data(), n);
      ScalarKernels().cast_f16(x.data(), hf.data(), n);
      ScalarKernels().scale(x.data(), scaled.data(), n, 0.3f);
      DeviceVec<float> dx(x, pad), dy(scaled, 0);
      DeviceVec<uint16_t> db(bf, 0), dh(hf, 0);
      ASSERT_TRUE(dx.ok() && dy.ok() && db.ok() && dh.ok());
      ASSERT_CUDA(LaunchCast(dx.get(), db.get(), n, ParamCopy::kBf16, nullptr));
      ASSERT_CUDA(LaunchCast(dx.get(), dh.get(), n, ParamCopy::kF16, nullptr));
      ASSERT_CUDA(LaunchScale(dx.get(), dy.get(), n, 0.3f, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      const std::string what = "n=" + std::to_string(n) + " pad=" + std::to_string(pad);
      ExpectBitEqual(bf, db.Host(), "bf16 " + what);
      ExpectBitEqual(hf, dh.Host(), "fp16 " + what);
      ExpectBitEqual(scaled, dy.Host(), "scale " + what);
    }
  }
}

TEST_F(CudaKernelsTest, WideningMatchesTheHostBitForBit) {
  for (size_t n : TestSizes()) {
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(i * 40503u + 7);  // every class: NaN, Inf, subnormal
    std::vector<float> want_bf(n), want_hf(n);
    for (size_t i = 0; i < n; ++i) {
      want_bf[i] = Bf16ToFloat(bits[i]);
      want_hf[i] = HalfToFloat(bits[i]);
    }
    DeviceVec<uint16_t> dx(bits, 1);
    DeviceVec<float> db(want_bf, 0), dh(want_hf, 0);
    ASSERT_TRUE(dx.ok() && db.ok() && dh.ok());
    ASSERT_CUDA(cudaMemset(db.get(), 0, n * 4));
    ASSERT_CUDA(cudaMemset(dh.get(), 0, n * 4));
    ASSERT_CUDA(LaunchWiden(dx.get(), db.get(), n, ParamCopy::kBf16, nullptr));
    ASSERT_CUDA(LaunchWiden(dx.get(), dh.get(), n, ParamCopy::kF16, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectBitEqual(want_bf, db.Host(), "bf16 -> f32 n=" + std::to_string(n));
    ExpectBitEqual(want_hf, dh.Host(), "fp16 -> f32 n=" + std::to_string(n));
  }
}

TEST_F(CudaKernelsTest, SumSquaresIsWithinItsBoundAndCountNonFiniteIsExact) {
  for (size_t n : TestSizes()) {
    const std::vector<float> x = Uniform(n, -3, 3, 23);
    std::vector<float> bits = RandomBits(n, 29);
    DeviceVec<float> dx(x, 1), dbits(bits, 0);
    DeviceVec<double> work(std::vector<double>(kSumSquaresBlocks), 0), out(std::vector<double>(1), 0);
    DeviceVec<unsigned long long> count(std::vector<unsigned long long>(1, 99), 0);
    ASSERT_TRUE(dx.ok() && dbits.ok() && work.ok() && out.ok() && count.ok());
    ASSERT_CUDA(LaunchSumSquares(dx.get(), n, work.get(), out.get(), nullptr));
    ASSERT_CUDA(LaunchCountNonFinite(dbits.get(), n, count.get(), nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    const double want = ScalarKernels().sum_squares(x.data(), n);
    EXPECT_NEAR(out.Host()[0], want, want * (static_cast<double>(n) + 64) * 0x1p-52) << "n=" << n;
    EXPECT_EQ(count.Host()[0], ScalarKernels().count_non_finite(bits.data(), n)) << "n=" << n;
  }
}

}  // namespace
}  // namespace strata::kernels::cuda
