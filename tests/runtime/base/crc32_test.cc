// Tests for runtime/base/crc32: the published CRC-32 check values (so checkpoints written by any earlier
// build, and by zlib, still verify), and both halves of the implementation (the table loop and the
// PCLMULQDQ folding kernel) against a bitwise oracle at awkward sizes, misaligned starts, large buffers
// and in the incremental form.
#include "runtime/base/crc32.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/base/crc32_internal.h"

namespace strata {
namespace {

// The definition, one bit at a time: reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF.
uint32_t BitwiseCrc32(const unsigned char* p, size_t n, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

std::vector<unsigned char> RandomBytes(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

uint32_t OfString(const std::string& s) { return Crc32(s.data(), s.size()); }

TEST(Crc32, HasThePublishedCheckValues) {
  EXPECT_EQ(OfString("123456789"), 0xCBF43926u);  // the catalogue's check value of CRC-32/ISO-HDLC
  EXPECT_EQ(OfString(""), 0x00000000u);
  EXPECT_EQ(OfString("a"), 0xE8B7BE43u);
  EXPECT_EQ(OfString("abc"), 0x352441C2u);
  EXPECT_EQ(OfString("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  EXPECT_EQ(internal::Crc32Table("123456789", 9, 0), 0xCBF43926u);
  EXPECT_EQ(BitwiseCrc32(reinterpret_cast<const unsigned char*>("123456789"), 9, 0), 0xCBF43926u);
}

TEST(Crc32, EmptyInputReturnsTheRunningValue) {
  EXPECT_EQ(Crc32(nullptr, 0), 0u);
  EXPECT_EQ(Crc32(nullptr, 0, 0xDEADBEEFu), 0xDEADBEEFu);
}

// Sizes around every boundary of the dispatch: < 16 (table only), the 16-byte fold blocks, the 64-byte
// minimum and step of the kernel, and the table tail after it; each at every start offset within 16 bytes.
TEST(Crc32, MatchesTheBitwiseOracleAtAwkwardSizesAndOffsets) {
  const auto data = RandomBytes((1 << 16) + 16, 7);
  for (size_t n : {1, 2, 3, 4, 5, 7, 15, 16, 17, 31, 33, 63, 64, 65, 79, 80, 81, 127, 128, 129, 191, 1000, 4095,
                   4096, 4097, 65000, 65536}) {
    for (size_t off = 0; off < 16; ++off) {
      const unsigned char* p = data.data() + off;
      const uint32_t want = BitwiseCrc32(p, n, 0x1234);
      EXPECT_EQ(Crc32(p, n, 0x1234), want) << "n=" << n << " offset=" << off << " impl=" << Crc32Implementation();
      EXPECT_EQ(internal::Crc32Table(p, n, 0x1234), want) << "table, n=" << n << " offset=" << off;
    }
  }
}

// The folding kernel on its own (Crc32 uses it only for the bulk of long inputs), so a wrong constant
// cannot hide behind the table tail.
TEST(Crc32, FoldingKernelMatchesTheOracle) {
  if (!internal::Crc32HavePclmul()) GTEST_SKIP() << "this CPU has no PCLMULQDQ/SSE4.1: Crc32 uses the table";
  EXPECT_STREQ(Crc32Implementation(), "pclmul");
  const auto data = RandomBytes(8192 + 16, 11);
  for (size_t n : {64, 80, 96, 112, 128, 144, 192, 256, 4096, 8192}) {
    for (size_t off : {0, 1, 5, 8, 15}) {
      const unsigned char* p = data.data() + off;
      EXPECT_EQ(~internal::Crc32FoldPclmul(p, n, ~0xABCDu), BitwiseCrc32(p, n, 0xABCD)) << "n=" << n << " off=" << off;
    }
  }
}

TEST(Crc32, LargeBufferMatchesTheOracle) {
  const auto data = RandomBytes((8 << 20) + 13, 3);  // 8 MiB and an odd tail, from an odd start
  EXPECT_EQ(Crc32(data.data() + 1, data.size() - 1), BitwiseCrc32(data.data() + 1, data.size() - 1, 0));
  const std::vector<unsigned char> zeros(1 << 20, 0);
  EXPECT_EQ(Crc32(zeros.data(), zeros.size()), BitwiseCrc32(zeros.data(), zeros.size(), 0));
}

TEST(Crc32, IsIncrementalAtEverySplit) {
  const auto data = RandomBytes(300, 5);
  const uint32_t whole = BitwiseCrc32(data.data(), data.size(), 0);
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    EXPECT_EQ(Crc32(data.data() + cut, data.size() - cut, Crc32(data.data(), cut)), whole) << "cut=" << cut;
  }
}

TEST(Crc32, StreamsOverUnevenChunks) {
  const auto data = RandomBytes(1 << 20, 9);
  std::mt19937 rng(13);
  uint32_t running = 0;
  size_t at = 0;
  while (at < data.size()) {
    const size_t n = std::min<size_t>(data.size() - at, rng() % 5000);
    running = Crc32(data.data() + at, n, running);
    at += n;
  }
  EXPECT_EQ(running, Crc32(data.data(), data.size()));
  EXPECT_EQ(running, BitwiseCrc32(data.data(), data.size(), 0));
}

// Crc32Combine and Crc32Middle against the oracle on the spliced bytes, at every split of a short input (empty
// pieces included) and at tile sizes (a 4 MiB tile cut at awkward places, as the checkpoint writer splits one).
TEST(Crc32, CombineAndMiddleSpliceAtEverySplit) {
  const auto data = RandomBytes(97, 21);
  const uint32_t whole = BitwiseCrc32(data.data(), data.size(), 0);
  for (size_t a = 0; a <= data.size(); ++a) {
    for (size_t b = a; b <= data.size(); b += 3) {
      const uint32_t before = BitwiseCrc32(data.data(), a, 0), middle = BitwiseCrc32(data.data() + a, b - a, 0);
      const uint32_t after = BitwiseCrc32(data.data() + b, data.size() - b, 0);
      ASSERT_EQ(Crc32Combine(Crc32Combine(before, middle, b - a), after, data.size() - b), whole) << a << " " << b;
      ASSERT_EQ(Crc32Middle(whole, before, after, b - a, data.size() - b), middle) << a << " " << b;
    }
  }
}

TEST(Crc32, MiddleOfATileFromItsCrc) {
  const auto data = RandomBytes(4 << 20, 23);
  const uint32_t whole = Crc32(data.data(), data.size());
  for (const auto& [a, b] : std::vector<std::pair<size_t, size_t>>{
           {0, 1}, {4093, 1 << 21}, {1, data.size()}, {12345, data.size() - 7}, {0, data.size()}}) {
    const uint32_t before = Crc32(data.data(), a), after = Crc32(data.data() + b, data.size() - b);
    EXPECT_EQ(Crc32Middle(whole, before, after, b - a, data.size() - b), BitwiseCrc32(data.data() + a, b - a, 0))
        << a << " " << b;
  }
  EXPECT_NE(Crc32Middle(whole ^ 1, 0, 0, data.size(), 0), whole);  // a wrong whole gives a wrong piece
}

}  // namespace
}  // namespace strata
