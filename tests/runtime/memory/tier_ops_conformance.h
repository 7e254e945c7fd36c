// The memory::TierOps conformance suite (Note [Tier ops] in runtime/memory/tier_ops.h): one set of test
// bodies that every tier's operations pass. A test binary includes this header once and instantiates it
// with a TierUnderTest per implementation: tier_ops_test.cc the host tier (ctest), tier_ops_cuda_test.cc
// the CUDA device tier (label gpu, run by scripts/gpu_check; skips without a GPU).
//
// Every body reaches the tier's memory only through the ops themselves (FromHost / ToHost), so it runs
// unchanged on memory the CPU cannot read, and compares bit for bit against the element math of
// kernels/common (the host kernels and the kernels/cuda twins share it); only the sum of squares, whose
// summation order is the implementation's (kernels/cuda/sum_squares.cuh), is compared with a bound when
// the tier says its order differs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "runtime/device/device.h"
#include "runtime/memory/tier_ops.h"

namespace strata::memory::conformance {

// One implementation under test. Each function is called from the test body (after the fixture's own
// skip, where there is one).
struct TierUnderTest {
  std::string name;
  bool host_visible = true;          // what host_visible() must say
  bool in_order_sum_squares = true;  // SumSquares adds in index order (the host's), so it is exact
  std::function<std::unique_ptr<TierOps>()> make_ops;
  std::function<void*(size_t bytes)> allocate;  // memory of the tier (nullptr: failure)
  std::function<void(void*)> release;
  std::function<std::unique_ptr<device::Stream>()> make_stream;  // a stream the "On" operations enqueue on
  std::function<bool()> available = [] { return true; };         // false: the test skips (no GPU)
};

inline std::ostream& operator<<(std::ostream& os, const TierUnderTest& t) { return os << t.name; }

// Element counts: empty, one, odd, larger than a vector, and not a multiple of 2, 3 or 4.
inline constexpr size_t kConformanceCounts[] = {0, 1, 7, 1000, 1001};

// fp32 values that exercise the casts and sums: signs, ties of both roundings, subnormals, infinities
// (and NaN only where `special`).
inline std::vector<float> ConformanceValues(size_t n, float scale, bool special = false) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * (static_cast<float>((i * 7919) % 1013) - 506.0f) / 7.0f;
    if (!special) continue;
    switch (i % 11) {
      case 3:
        v[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
        break;
      case 5:
        v[i] = 1.0f + std::ldexp(1.0f, -8) * 3;
        break;  // a bf16 tie
      case 7:
        v[i] = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity();
        break;
      case 9:
        v[i] = std::numeric_limits<float>::quiet_NaN();
        break;
      default:
        break;
    }
  }
  return v;
}

class TierOpsConformance : public ::testing::TestWithParam<TierUnderTest> {
 protected:
  void SetUp() override {
    if (!GetParam().available()) GTEST_SKIP() << GetParam().name << ": not available on this machine";
    ops_ = GetParam().make_ops();
    ASSERT_NE(ops_, nullptr);
    stream_ = GetParam().make_stream();
    ASSERT_NE(stream_, nullptr);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_TRUE(stream_->Synchronize().ok());
    }
    for (void* p : owned_) GetParam().release(p);
  }
  // `bytes` of the tier's memory (at least one byte, so that an empty range still has an address).
  void* Tier(size_t bytes) {
    void* p = GetParam().allocate(bytes == 0 ? 1 : bytes);
    EXPECT_NE(p, nullptr) << "allocating " << bytes << " bytes of the tier";
    if (p != nullptr) owned_.push_back(p);
    return p;
  }
  // A tier buffer holding `values`.
  float* TierHolding(const std::vector<float>& values) {
    auto* p = static_cast<float*>(Tier(values.size() * 4));
    EXPECT_TRUE(ops_->FromHost(p, values.data(), values.size() * 4).ok());
    return p;
  }
  template <typename T>
  std::vector<T> Read(const void* p, size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(ops_->ToHost(out.data(), p, n * sizeof(T)).ok());
    return out;
  }
  // Bit for bit; a NaN matches any NaN (a device may return the canonical NaN for arithmetic on one).
  static void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(got[i]) && std::isnan(want[i])) continue;
      EXPECT_EQ(kernels::FloatBits(got[i]), kernels::FloatBits(want[i]))
          << what << " element " << i << " of " << got.size() << ": " << got[i] << " vs " << want[i];
    }
  }

  std::unique_ptr<TierOps> ops_;
  std::unique_ptr<device::Stream> stream_;
  std::vector<void*> owned_;
};

TEST_P(TierOpsConformance, SaysWhetherTheHostReachesIt) { EXPECT_EQ(ops_->host_visible(), GetParam().host_visible); }

TEST_P(TierOpsConformance, CopiesToAndFromTheHostRoundTrip) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n, 1.0f, /*special=*/true);
    float* p = TierHolding(in);
    ExpectSameBits(Read<float>(p, n), in, "FromHost then ToHost");
  }
}

TEST_P(TierOpsConformance, ZeroClearsExactlyTheRange) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n + 2, 1.0f);
    float* p = TierHolding(in);
    ASSERT_TRUE(ops_->Zero(p + 1, n * 4).ok());
    std::vector<float> want = in;
    for (size_t i = 1; i <= n; ++i) want[i] = 0.0f;
    ExpectSameBits(Read<float>(p, n + 2), want, "Zero of [1, n + 1)");
  }
}

TEST_P(TierOpsConformance, AccumulateOnAddsInStreamOrder) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> a = ConformanceValues(n, 1.0f), b = ConformanceValues(n, -0.37f);
    float* dst = TierHolding(a);
    float* src = TierHolding(b);
    // Twice, then a copy back enqueued behind them: the stream runs them in order.
    ops_->AccumulateOn(*stream_, dst, src, n);
    ops_->AccumulateOn(*stream_, dst, src, n);
    std::vector<float> got(n + 1, -1.0f);  // one more: nothing is written past the range
    ops_->ToHostOn(*stream_, got.data(), dst, n * 4);
    ASSERT_TRUE(stream_->Synchronize().ok());
    std::vector<float> want = a;
    for (size_t i = 0; i < n; ++i) want[i] = (want[i] + b[i]) + b[i];
    want.push_back(-1.0f);
    ExpectSameBits(got, want, "AccumulateOn twice");
  }
}

TEST_P(TierOpsConformance, StreamCopiesRunInStreamOrder) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n, 2.0f, /*special=*/true);
    float* p = static_cast<float*>(Tier(n * 4));
    std::vector<float> out(n, 0.0f);
    ops_->FromHostOn(*stream_, p, in.data(), n * 4);
    ops_->ToHostOn(*stream_, out.data(), p, n * 4);
    ASSERT_TRUE(stream_->Synchronize().ok());
    ExpectSameBits(out, in, "FromHostOn then ToHostOn");
  }
}

TEST_P(TierOpsConformance, ScaleIsTheElementProduct) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n, 1.0f, /*special=*/true);
    float* p = TierHolding(in);
    ASSERT_TRUE(ops_->Scale(p, n, 0.125f / 3.0f).ok());
    std::vector<float> want = in;
    for (float& x : want) x *= 0.125f / 3.0f;
    ExpectSameBits(Read<float>(p, n), want, "Scale");
  }
}

TEST_P(TierOpsConformance, SumSquaresIsTheDoubleSum) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n, 0.01f);
    const float* p = TierHolding(in);
    auto got = ops_->SumSquares(p, n);
    ASSERT_TRUE(got.ok()) << got.status();
    double want = 0;
    for (float x : in) want += static_cast<double>(x) * static_cast<double>(x);
    if (GetParam().in_order_sum_squares) {
      EXPECT_EQ(*got, want) << n;
    } else {  // another order of the same double products: n rounding errors of the sum at most
      EXPECT_NEAR(*got, want, want * static_cast<double>(n + 1) * std::numeric_limits<double>::epsilon()) << n;
    }
  }
  // A non-finite element makes the sum non-finite (the step's skip depends on it).
  std::vector<float> bad = ConformanceValues(100, 1.0f);
  bad[42] = std::numeric_limits<float>::infinity();
  auto sum = ops_->SumSquares(TierHolding(bad), bad.size());
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_FALSE(std::isfinite(*sum));
}

TEST_P(TierOpsConformance, CastRoundsToNearestEvenAsTheElementMath) {
  for (size_t n : kConformanceCounts) {
    const std::vector<float> in = ConformanceValues(n, 3.0f, /*special=*/true);
    const float* src = TierHolding(in);
    float* copy = static_cast<float*>(Tier(n * 4));
    ASSERT_TRUE(ops_->Cast(DType::kF32, src, copy, n).ok());
    ExpectSameBits(Read<float>(copy, n), in, "Cast to fp32");
    for (DType to : {DType::kBF16, DType::kF16}) {
      void* dst = Tier(n * 2 + 2);
      ASSERT_TRUE(ops_->FromHost(dst, std::vector<uint16_t>(n + 1, 0xBEEF).data(), (n + 1) * 2).ok());
      ASSERT_TRUE(ops_->Cast(to, src, dst, n).ok());
      const std::vector<uint16_t> got = Read<uint16_t>(dst, n + 1);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = to == DType::kBF16 ? kernels::FloatToBf16(in[i]) : kernels::FloatToHalf(in[i]);
        EXPECT_EQ(got[i], want) << DTypeName(to) << " element " << i << " of " << n << ": " << in[i];
      }
      EXPECT_EQ(got[n], 0xBEEF) << DTypeName(to) << ": written past the range";
    }
  }
}

}  // namespace strata::memory::conformance
