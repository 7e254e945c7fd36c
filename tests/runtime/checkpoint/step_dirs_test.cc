// Step directory names, and a removal that takes the manifest first: interrupted after its first
// removal, a pruned step no longer looks complete.
#include "runtime/checkpoint/step_dirs.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/manifest.h"
#include "tests/runtime/checkpoint/test_dir.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using StepDirs = testing::TestDir;

TEST(ParseStepDirName, ReadsOnlyWhatStepDirNameWrites) {
  EXPECT_EQ(ParseStepDirName(StepDirName(100)), 100);
  EXPECT_EQ(ParseStepDirName(StepDirName(123456789)), 123456789);
  for (const char* bad : {"step_", "step_12a", "step_00000003_s1", "flipped", "step_-1", "Step_1",
                          "step_99999999999999999999"}) {
    EXPECT_FALSE(ParseStepDirName(bad).has_value()) << bad;
  }
}

// Keep-last pruning and "the latest" read this list: names sorted as text once put step_100000000 before
// step_99999999 (pruning the newest), and a stray "step_x" or "step_00000004_old" counted as a step.
TEST_F(StepDirs, CompleteStepsAreOursInStepOrder) {
  for (const char* d : {"step_99999999", "step_100000000", "step_00000002", "step_x", "step_00000004_old"}) {
    Write(std::string(d) + "/manifest.json", "{}");
  }
  Write("step_00000006/shard_00000.bin", "x");       // no manifest: incomplete
  fs::create_directories(Path("step_00000008/manifest.json"));  // a directory, not a manifest
  EXPECT_THAT(CompleteSteps(dir_.string()),
              ::testing::ElementsAre(Path("step_00000002"), Path("step_99999999"), Path("step_100000000")));
  auto latest = ResolveCheckpoint(dir_.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, Path("step_100000000"));
}

TEST_F(StepDirs, RemoveStepRemovesEverything) {
  Write("step_00000002/manifest.json", "{}");
  Write("step_00000002/shard_00000.bin", "x");
  ASSERT_TRUE(RemoveStep(Path("step_00000002")).ok());
  EXPECT_FALSE(fs::exists(Path("step_00000002")));
}

TEST_F(StepDirs, InterruptedRemovalLeavesNoManifest) {
  Write("step_00000002/manifest.json", "{}");
  Write("step_00000002/shard_00000.bin", "x");
  Write("step_00000002/shard_00001.bin", "x");
  Write("step_00000004/manifest.json", "{}");
  std::vector<std::string> removed;
  const RemovePathFn dies_after_one = [&](const std::string& p) -> absl::Status {
    if (!removed.empty()) return absl::AbortedError("killed");
    removed.push_back(fs::path(p).filename().string());
    return RemovePath(p);
  };
  absl::Status s = RemoveStep(Path("step_00000002"), dies_after_one);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(removed, ::testing::ElementsAre(kManifestName));
  EXPECT_TRUE(fs::exists(Path("step_00000002/shard_00000.bin")));
  EXPECT_THAT(CompleteSteps(dir_.string()), ::testing::ElementsAre(Path("step_00000004")));
  auto latest = ResolveCheckpoint(dir_.string());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Path("step_00000004"));
}

}  // namespace
}  // namespace strata::checkpoint
