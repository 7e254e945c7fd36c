// Tests for runtime/base/units: ParseBytes (suffixes, case, whitespace, decimals, errors naming the
// text, overflow), FormatBytes and RoundUp.
#include "runtime/base/units.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;

struct ParseCase {
  std::string text;
  uint64_t bytes;
};

TEST(ParseBytes, AcceptsNumbersWithBinaryAndDecimalSuffixes) {
  const std::vector<ParseCase> cases = {
      {"4096", 4096},
      {"0", 0},
      {"7B", 7},
      {"512MiB", 512 * kMiB},
      {"1.5GiB", 3 * kGiB / 2},
      {"2GB", 2000000000},
      {"12 kib", 12 * kKiB},
      {"  3 TiB  ", 3 * kTiB},
      {"1KB", 1000},
      {"1kb", 1000},
      {"5MB", 5000000},
      {"2TB", 2000000000000},
      {"64k", 64 * kKiB},
      {"8M", 8 * kMiB},
      {"1g", kGiB},
      {"0.5KiB", 512},
  };
  for (const ParseCase& c : cases) {
    auto got = ParseBytes(c.text);
    ASSERT_TRUE(got.ok()) << "text '" << c.text << "': " << got.status();
    EXPECT_EQ(*got, c.bytes) << "text '" << c.text << "': expected " << c.bytes << ", actual " << *got;
  }
}

TEST(ParseBytes, RejectsMalformedTextWithInvalidArgumentNamingIt) {
  for (const std::string text : {"abc", "-1", "5XB", "", "   ", ".", "1.2.3", "MiB", "12 k i b", "1e3", "0x10"}) {
    auto got = ParseBytes(text);
    ASSERT_FALSE(got.ok()) << "text '" << text << "' parsed as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << "text '" << text << "': " << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("'" + text + "'")) << "text '" << text << "'";
  }
}

TEST(ParseBytes, UnknownUnitErrorNamesTheUnit) {
  auto got = ParseBytes("5XB");
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("'xb'"));
}

TEST(ParseBytes, ParsesValuesAboveTheSignedRangeExactly) {
  // 1e19 bytes lies between INT64_MAX and UINT64_MAX; it is exact in a double, so the result must be too.
  auto got = ParseBytes("10000000TB");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, uint64_t{10000000000000000000u});
  auto big = ParseBytes("16777215TiB");  // 2^64 - 2^40
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(*big, uint64_t{16777215} * kTiB);
}

TEST(ParseBytes, RejectsValuesBeyondUint64WithInvalidArgument) {
  for (const std::string text : {"16777216TiB", "20000000TB", "99999999999999999999999"}) {
    auto got = ParseBytes(text);
    ASSERT_FALSE(got.ok()) << "text '" << text << "' parsed as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(text));
  }
}

TEST(FormatBytes, PrintsBytesBelowOneKiBExactly) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1), "1 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

TEST(FormatBytes, PrintsTwoDecimalsInTheLargestBinaryUnit) {
  EXPECT_EQ(FormatBytes(kKiB), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512.00 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(5 * kTiB), "5.00 TiB");
  EXPECT_EQ(FormatBytes(2048 * kTiB), "2048.00 TiB") << "TiB is the largest unit";
}

TEST(FormatBytes, RoundTripsThroughParseBytesWhenExact) {
  for (uint64_t bytes : {uint64_t{0}, uint64_t{777}, kKiB, 3 * kMiB / 2, 512 * kMiB, 3 * kGiB / 2, 7 * kTiB}) {
    auto back = ParseBytes(FormatBytes(bytes));
    ASSERT_TRUE(back.ok()) << "'" << FormatBytes(bytes) << "': " << back.status();
    EXPECT_EQ(*back, bytes) << "via '" << FormatBytes(bytes) << "'";
  }
}

TEST(RoundUp, RoundsToTheNextMultiple) {
  static_assert(RoundUp(0, 64) == 0);
  static_assert(RoundUp(1, 64) == 64);
  static_assert(RoundUp(64, 64) == 64);
  static_assert(RoundUp(65, 64) == 128);
  EXPECT_EQ(RoundUp(1000, 3 * 64), 1152u);  // multiples need not be powers of two
  EXPECT_EQ(RoundUp(7, 1), 7u);
}

}  // namespace
}  // namespace strata
