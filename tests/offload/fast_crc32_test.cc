// Tests for offload/fast_crc32: equal to the table CRC-32 (runtime/base/crc32.h, the oracle) at awkward
// sizes and misalignments, incrementally, and on the known check value.
#include "offload/fast_crc32.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/base/crc32.h"

namespace strata::offload {
namespace {

TEST(FastCrc32, MatchesTheTableImplementationAtAwkwardSizesAndOffsets) {
  std::vector<unsigned char> data(1 << 16);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4095, 4096, 4097, 65000}) {
    for (size_t off : {0, 1, 3, 8, 15}) {
      const uint32_t want = Crc32(data.data() + off, n, 0x1234);
      const uint32_t got = FastCrc32(data.data() + off, n, 0x1234);
      EXPECT_EQ(got, want) << "n=" << n << " offset=" << off << " impl=" << FastCrc32Implementation();
    }
  }
}

TEST(FastCrc32, IsIncrementalAndHasTheStandardCheckValue) {
  const char* check = "123456789";
  EXPECT_EQ(FastCrc32(check, 9), 0xCBF43926u);
  std::vector<unsigned char> data(10000, 0xAB);
  const uint32_t whole = FastCrc32(data.data(), data.size());
  EXPECT_EQ(FastCrc32(data.data() + 777, data.size() - 777, FastCrc32(data.data(), 777)), whole);
}

}  // namespace
}  // namespace strata::offload
