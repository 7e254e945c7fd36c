// HostExecutor: variant resolution and its errors, thread-count validation, and the tensor helpers giving
// the same bits for every variant and thread count.
#include "runtime/optim/host_executor.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/isa.h"

namespace strata::optim {
namespace {

TEST(HostExecutor, ResolvesTheWidestVariantByDefaultAndNamedOnesOnRequest) {
  auto best = HostExecutor::Create(1, "");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ((*best)->kernels().isa, kernels::cpu::BestIsa());
  EXPECT_EQ((*best)->pool(), nullptr) << "one thread needs no pool";
  auto scalar = HostExecutor::Create(2, "scalar");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_STREQ((*scalar)->isa_name(), "scalar");
  EXPECT_EQ((*scalar)->threads(), 2);
}

TEST(HostExecutor, RejectsUnknownVariantsAndBadThreadCounts) {
  auto bad = HostExecutor::Create(1, "avx1024");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("avx1024"), absl::string_view::npos);
  EXPECT_EQ(HostExecutor::Create(0, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostExecutor::Create(100000, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostExecutor, RefusesAVariantThisCpuLacks) {
  for (auto isa : {kernels::cpu::Isa::kAvx2, kernels::cpu::Isa::kAvx512, kernels::cpu::Isa::kAvx512Bf16}) {
    if (kernels::cpu::IsaSupported(isa)) continue;
    EXPECT_EQ(HostExecutor::Create(1, kernels::cpu::IsaName(isa)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    return;
  }
  GTEST_SKIP() << "this CPU supports every variant, so none can be refused";
}

TEST(HostExecutor, TensorHelpersGiveTheSameBitsForEveryVariantAndThreadCount) {
  std::vector<float> x(1 << 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  x[12345] = 1e-40f;
  auto ref = HostExecutor::Create(1, "scalar");
  ASSERT_TRUE(ref.ok());
  const double want_sum = (*ref)->SumSquares(x.data(), x.size());
  for (const char* isa : {"scalar", "avx2", "avx512", "avx512bf16"}) {
    for (int threads : {1, 2}) {
      auto e = HostExecutor::Create(threads, isa);
      if (!e.ok()) continue;
      EXPECT_EQ((*e)->SumSquares(x.data(), x.size()), want_sum) << isa << " threads=" << threads;
      EXPECT_EQ((*e)->CountNonFinite(x.data(), x.size()), 0u);
      std::vector<uint16_t> bf(x.size()), hf(x.size());
      (*e)->CastToBf16(x.data(), bf.data(), x.size());
      (*e)->CastToHalf(x.data(), hf.data(), x.size());
      std::vector<float> y = x;
      (*e)->Scale(y.data(), y.size(), 0.25f);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(bf[i], kernels::FloatToBf16(x[i])) << isa << " " << i;
        ASSERT_EQ(hf[i], kernels::FloatToHalf(x[i])) << isa << " " << i;
        ASSERT_EQ(y[i], x[i] * 0.25f) << isa << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace strata::optim
