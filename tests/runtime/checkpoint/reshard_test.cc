// Resharding: the interval arithmetic that moves saved state into another layout (restore at another
// world size, export of whole parameters), over the two-rank tiny checkpoint (8 elements per rank).
#include "runtime/checkpoint/reshard.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/consolidate.h"
#include "tests/runtime/checkpoint/test_dir.h"
#include "tests/runtime/checkpoint/tiny_checkpoint.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;

// The tiny checkpoint, written and its manifest read.
class Reshard : public testing::TestDir {
 protected:
  void SetUp() override {
    testing::TestDir::SetUp();
    testing::WriteTinyCheckpoint(dir(), 3);
    auto m = ReadManifest(dir());
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *std::move(m);
  }
  std::string dir() const { return Path("step_00000003"); }
  Manifest manifest_;
};

std::vector<float> Iota(uint64_t begin, uint64_t end, float plus = 0) {
  std::vector<float> v;
  for (uint64_t i = begin; i < end; ++i) v.push_back(static_cast<float>(i) + plus);
  return v;
}

TEST(CopyOverlap, CopiesOnlyThePartInsideTheWantedRange) {
  const ShardRange range{"u", "w", "master", 4, 6};  // elements [4, 10)
  const std::vector<float> values = Iota(4, 10);
  std::vector<float> dst(5, -1);  // wants [6, 11)
  EXPECT_EQ(CopyOverlap(range, values, 6, 11, dst.data()), 4u);
  EXPECT_EQ(dst, (std::vector<float>{6, 7, 8, 9, -1}));
  std::vector<float> before(4, -1);  // wants [2, 6): the range starts inside it
  EXPECT_EQ(CopyOverlap(range, values, 2, 6, before.data()), 2u);
  EXPECT_EQ(before, (std::vector<float>{-1, -1, 4, 5}));
  std::vector<float> apart(3, -1);  // wants [10, 13): no overlap, nothing written
  EXPECT_EQ(CopyOverlap(range, values, 10, 13, apart.data()), 0u);
  EXPECT_EQ(apart, std::vector<float>(3, -1));
}

// A unit of three parameters: w [0, 10), b [10, 16), c [16, 20).
ManifestUnit ThreeParams() {
  return ManifestUnit{"u", {{"w", {10}, 0, 10, true}, {"b", {6}, 10, 6, false}, {"c", {4}, 16, 4, false}}};
}

std::string Describe(const std::vector<SaveRange>& rs) {
  std::string out;
  for (const SaveRange& r : rs) {
    out += r.range.unit + "." + r.range.param + " " + r.range.kind + " [" + std::to_string(r.range.begin) + "+" +
           std::to_string(r.range.count) + ") k" + std::to_string(r.kind) + "; ";
  }
  return out;
}

TEST(RangesToSave, EachKindThenEachParameterOverlappingTheSlice) {
  const std::vector<std::string> kinds = {"master", "exp_avg"};
  // Rank 1 of two holds [10, 20): all of b and c, nothing of w.
  EXPECT_EQ(Describe(RangesToSave(ThreeParams(), 10, 20, kinds)),
            "u.b master [10+6) k0; u.c master [16+4) k0; u.b exp_avg [10+6) k1; u.c exp_avg [16+4) k1; ");
  // A slice of 7 elements [7, 14) cuts w and b; c lies outside it.
  EXPECT_EQ(Describe(RangesToSave(ThreeParams(), 7, 14, {"momentum"})),
            "u.w momentum [7+3) k0; u.b momentum [10+4) k0; ");
  // A slice past the unit's end (padding of the last rank) saves nothing.
  EXPECT_TRUE(RangesToSave(ThreeParams(), 20, 27, kinds).empty());
}

TEST(RangesToSave, TheSlicesOfAllRanksCoverEveryElementOnce) {
  for (uint64_t slice : {1, 3, 7, 10, 20}) {
    std::vector<int> seen(20, 0);
    for (uint64_t lo = 0; lo < 20; lo += slice) {
      for (const SaveRange& r : RangesToSave(ThreeParams(), lo, lo + slice, {"master"})) {
        EXPECT_GE(r.range.begin, lo);
        EXPECT_LE(r.range.begin + r.range.count, lo + slice);
        for (uint64_t i = r.range.begin; i < r.range.begin + r.range.count; ++i) ++seen[i];
      }
    }
    EXPECT_EQ(seen, std::vector<int>(20, 1)) << "slice " << slice;
  }
}

TEST_F(Reshard, ReadsARangeAcrossSavedShardsIntoANewSlice) {
  ShardReaders shards(manifest_, dir());
  // Elements [5, 10) of w: 5-7 were saved by rank 0, 8-9 by rank 1 (kind k holds i + 100 k).
  std::vector<float> w(5, -1);
  ASSERT_TRUE(ReadResharded(shards, "u", "w", "exp_avg", 5, 10, 8, w.data()).ok());
  EXPECT_EQ(w, Iota(5, 10, 100));
  std::vector<float> b(3, -1);
  ASSERT_TRUE(ReadResharded(shards, "u", "b", "exp_avg_sq", 12, 15, 8, b.data()).ok());
  EXPECT_EQ(b, Iota(12, 15, 200));
}

TEST_F(Reshard, ASavedShardThatLacksItsPartIsDataLoss) {
  ShardReaders shards(manifest_, dir());
  std::vector<float> w(10);
  // A saved layout of 4 elements per rank would put [4, 8) in rank 1, which holds only [8, 10).
  absl::Status s = ReadResharded(shards, "u", "w", "master", 0, 10, 4, w.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 lacks u.w master elements [4, 8) (it holds [8, 10))"));
  s = ReadResharded(shards, "u", "w", "momentum", 0, 4, 8, w.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 lacks u.w momentum elements [0, 4)"));
  EXPECT_EQ(ReadResharded(shards, "u", "w", "master", 0, 4, 0, w.data()).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata::checkpoint
