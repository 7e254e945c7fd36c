// Reading a whole checkpoint: export and --verify refuse files outside the step directory, a manifest of
// a later step than its directory, shards of the wrong rank, and ranges that miss or repeat elements.
#include "runtime/checkpoint/consolidate.h"

#include <filesystem>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/checkpoint/test_dir.h"
#include "tests/runtime/checkpoint/tiny_checkpoint.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Consolidate = testing::TestDir;

TEST_F(Consolidate, ReadsAndVerifiesAGoodCheckpoint) {
  const std::string d = Path("step_00000003");
  testing::WriteTinyCheckpoint(d, 3);
  auto m = ReadManifest(d);
  ASSERT_TRUE(m.ok()) << m.status();
  auto w = ReadMasterParam(d, *m, 0, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  auto rep = VerifyCheckpoint(d, *m);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->files, 2u);
  EXPECT_EQ(rep->ranges, 9u);
  EXPECT_EQ(ReadMasterParam(d, *m, 0, 2).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(Consolidate, ManifestStepPastItsDirectoryNameIsRefused) {
  testing::WriteTinyCheckpoint(Path("step_00000002"), 3);
  absl::Status s = ReadManifest(Path("step_00000002")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("field 'step' is 3"));
  testing::WriteTinyCheckpoint(Path("step_00000004"), 3);  // fewer applied updates (skipped fp16 steps)
  EXPECT_TRUE(ReadManifest(Path("step_00000004/")).ok());
  testing::WriteTinyCheckpoint(Path("custom_name"), 3);
  EXPECT_TRUE(ReadManifest(Path("custom_name")).ok());
}

TEST_F(Consolidate, ShardFilesOutsideTheStepDirectoryAreRefused) {
  const std::string d = Path("step_00000003");
  testing::WriteTinyCheckpoint(d, 3);
  fs::rename(d + "/shard_00001.bin", Path("outside.bin"));  // a valid shard, moved out and referenced
  for (const std::string& name : {std::string("../outside.bin"), Path("outside.bin")}) {
    auto j = testing::ReadManifestJson(d);
    j["shards"][1]["file"] = name;
    testing::WriteManifestJson(d, j);
    absl::Status s = ReadManifest(d).status();
    EXPECT_FALSE(s.ok()) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shards[1].file")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(name)) << s;
  }
  auto j = testing::ReadManifestJson(d);
  j["shards"][1]["file"] = "shard_00001.bin";
  testing::WriteManifestJson(d, j);
  fs::create_symlink("../outside.bin", d + "/shard_00001.bin");
  auto m = ReadManifest(d);
  ASSERT_TRUE(m.ok()) << m.status();
  for (absl::Status s : {ReadMasterParam(d, *m, 0, 0).status(), VerifyCheckpoint(d, *m).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shards[1].file"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("shard_00001.bin"));
  }
}

TEST_F(Consolidate, ShardOfAnotherRankIsRefused) {
  const std::string d = Path("ckpt");
  testing::WriteTinyCheckpoint(d);
  auto j = testing::ReadManifestJson(d);
  std::swap(j["shards"][0]["rank"], j["shards"][1]["rank"]);  // rank 1 now names shard_00000.bin
  testing::WriteManifestJson(d, j);
  auto m = ReadManifest(d);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::Status s = VerifyCheckpoint(d, *m).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to rank 1 of 2; the manifest lists it for rank 0")) << s;
}

// Rank 1's shard rewritten with `ranges` (values as the tiny checkpoint's) and the manifest updated.
void ReplaceShard1(const std::string& d, std::vector<ShardRange> ranges) {
  auto w = ShardWriter::Create(d + "/shard_00001.bin", 1, 2, ranges);
  ASSERT_TRUE(w.ok());
  for (size_t i = 0; i < ranges.size(); ++i) {
    std::vector<float> v(ranges[i].count, 0.0f);
    ASSERT_TRUE(w->Write(i, v.data()).ok());
  }
  auto done = w->Finish();
  ASSERT_TRUE(done.ok());
  auto j = testing::ReadManifestJson(d);
  j["shards"][1]["bytes"] = done->second;
  j["shards"][1]["crc32"] = absl::StrFormat("%08x", done->first);
  testing::WriteManifestJson(d, j);
}

TEST_F(Consolidate, RangesThatMissOrRepeatElementsFailVerify) {
  const std::string d = Path("ckpt");
  std::vector<ShardRange> full;
  for (const std::string& kind : StateKinds("adamw")) {
    full.push_back({"u", "w", kind, 8, 2});
    full.push_back({"u", "b", kind, 12, 3});
  }
  struct Case {
    std::vector<ShardRange> ranges;
    std::string error;
  };
  std::vector<Case> cases;
  {
    auto r = full;
    r[1].count = 2;  // b master [12, 14): element 14 in no shard
    cases.push_back({r, "u.b master: elements [14, 15) are in no shard"});
  }
  {
    auto r = full;
    r[0] = {"u", "w", "master", 6, 4};  // w master [6, 10): 6 and 7 also in rank 0's
    cases.push_back({r, "u.w master: elements [6, 8) are in more than one shard"});
  }
  {
    auto r = full;
    r.pop_back();  // b exp_avg_sq missing
    cases.push_back({r, "u.b exp_avg_sq: elements [12, 15) are in no shard"});
  }
  {
    auto r = full;
    r.push_back({"u", "ghost", "master", 0, 1});
    cases.push_back({r, "u.ghost master, which the manifest does not list"});
  }
  for (const Case& c : cases) {
    fs::remove_all(d);
    testing::WriteTinyCheckpoint(d);
    ReplaceShard1(d, c.ranges);
    auto m = ReadManifest(d);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::Status s = VerifyCheckpoint(d, *m).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.error;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.error)) << s;
    // The header-only check an export runs first finds the same (a manifest missing a unit its shards hold
    // once exported a partial model).
    absl::Status cov = CheckCoverage(d, *m);
    EXPECT_EQ(cov.code(), absl::StatusCode::kDataLoss) << c.error;
    EXPECT_THAT(std::string(cov.message()), HasSubstr(c.error)) << cov;
  }
  // Export refuses the same holes.
  fs::remove_all(d);
  testing::WriteTinyCheckpoint(d);
  ReplaceShard1(d, cases[0].ranges);
  auto m = ReadManifest(d);
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(std::string(ReadMasterParam(d, *m, 0, 1).status().message()), HasSubstr("in no shard"));
}

}  // namespace
}  // namespace strata::checkpoint
