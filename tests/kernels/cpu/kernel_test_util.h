// Shared helpers of the host kernel tests: the ISA parameter (every variant is run when the CPU has it,
// skipped with the reason otherwise), deterministic inputs, and bit comparisons that report the index.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu::testing {

inline std::vector<Isa> AllIsas() { return {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}; }

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) { return IsaName(info.param); }

// The table of `isa`, or nullptr after GTEST_SKIP-ing with the reason (use: if (!k) return;).
#define STRATA_KERNELS_OR_SKIP(k, isa)                                                        \
  const ::strata::kernels::cpu::CpuKernels* k = ::strata::kernels::cpu::GetCpuKernels(isa);  \
  if (k == nullptr) GTEST_SKIP() << "this CPU does not support " << IsaName(isa) << "; variant not run"

// The sizes the issue asks for: empty, one, odd, past a page of vectors, and a few million (odd).
inline std::vector<size_t> TestSizes() { return {0, 1, 7, 4099, 3000017}; }

// Uniform in [lo, hi), deterministic per seed.
inline std::vector<float> Uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

// Any 32-bit pattern: every class of float (NaNs with payloads, Inf, subnormals, zeros) shows up.
inline std::vector<float> RandomBits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (float& f : x) {
    const uint32_t u = rng();
    std::memcpy(&f, &u, sizeof(f));
  }
  return x;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// First index where a and b differ bit for bit (n when none).
template <class T>
size_t FirstMismatch(const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return i;
  }
  return n;
}

// EXPECTs bit equality of two arrays; on failure prints the first differing index and both values.
template <class T>
void ExpectBitEqual(const std::vector<T>& expected, const std::vector<T>& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  const size_t i = FirstMismatch(expected.data(), actual.data(), expected.size());
  if (i == expected.size()) return;
  if constexpr (std::is_same_v<T, float>) {
    ADD_FAILURE() << what << ": index " << i << " of " << expected.size() << ": expected " << expected[i]
                  << " (0x" << std::hex << Bits(expected[i]) << "), actual " << std::dec << actual[i] << " (0x"
                  << std::hex << Bits(actual[i]) << ")";
  } else {
    ADD_FAILURE() << what << ": index " << i << " of " << expected.size() << ": expected 0x" << std::hex
                  << +expected[i] << ", actual 0x" << +actual[i];
  }
}

}  // namespace strata::kernels::cpu::testing
