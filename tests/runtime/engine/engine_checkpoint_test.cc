// Checkpoints: bitwise resume at the same world size (stages 1-3), resharding 4 -> 2 -> 1 and 1 -> 4,
// an unpublished (killed) save not mistaken for a complete one, and every corruption case as a named
// error: flipped byte, truncated shard, missing shard, newer format, another model, another dtype; a
// hostile manifest (files outside the step directory, wrong types, deep trainer state, a renamed step) is
// refused; a failed save leaves no temporaries and a later save removes those a dead one left.
#include <filesystem>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;
using mlp::Mlp;
using ::testing::HasSubstr;

constexpr int kGlobalBatch = 8;

struct Plan {
  int world = 1, stage = 3;
  int first_step = 0, steps = 0;
  std::string load, save;  // step directories
  DType dtype = DType::kF32;
  int hidden = 48;
  std::string save_rank1;  // when set, rank 1 saves here instead: a directory rank 0 does not see
};

// Runs `steps` MLP steps from `first_step` (after loading `load` if set), saves to `save` if set, and
// returns rank 0's consolidated parameters.
absl::StatusOr<std::vector<float>> Train(const Plan& plan) {
  std::vector<float> out;
  std::mutex mu;
  auto results = testing::RunRanks(plan.world, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    EngineConfig cfg;
    cfg.stage = plan.stage;
    cfg.param_dtype = plan.dtype;
    cfg.optimizer.lr = 1e-2;
    cfg.optimizer.weight_decay = 0.01;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*e, mlp::MlpShape{16, plan.hidden, 4}));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    if (!plan.load.empty()) {
      STRATA_ASSIGN_OR_RETURN(std::string trainer, e->LoadCheckpoint(plan.load));
      if (trainer != "{\"next_step\":" + std::to_string(plan.first_step) + "}") {
        return absl::InternalError("trainer state did not round-trip: " + trainer);
      }
    }
    const int micro = kGlobalBatch / plan.world;
    for (int s = plan.first_step; s < plan.first_step + plan.steps; ++s) {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, int64_t{s} * kGlobalBatch + rank * micro, micro).status());
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      STRATA_RETURN_IF_ERROR(e->Step().status());
    }
    if (!plan.save.empty()) {
      const std::string* where = rank == 1 && !plan.save_rank1.empty() ? &plan.save_rank1 : &plan.save;
      STRATA_RETURN_IF_ERROR(
          e->SaveCheckpoint(*where, absl::StrCat("{\"next_step\":", plan.first_step + plan.steps, "}")));
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> all, e->GatherAllParams());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(all);
    }
    return absl::OkStatus();
  });
  // Every rank's error, joined: a corrupted shard is named by the rank that read it, and the others
  // report that loading failed on that rank.
  absl::Status first;
  std::string all;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    if (first.ok()) first = results[r];
    absl::StrAppend(&all, "rank ", r, ": ", results[r].message(), "\n");
  }
  if (!first.ok()) return absl::Status(first.code(), all);
  return out;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Step(int s) const { return (dir_ / checkpoint::StepDirName(s)).string(); }
  fs::path dir_;
};

TEST_F(Checkpoint, ResumeAtTheSameWorldSizeIsBitwiseIdentical) {
  for (int stage : {1, 2, 3}) {
    const auto straight = Train({2, stage, 0, 6});
    ASSERT_TRUE(straight.ok()) << straight.status();
    const std::string at3 = Step(3) + "_s" + std::to_string(stage);
    ASSERT_TRUE(Train({2, stage, 0, 3, "", at3}).ok());
    const auto resumed = Train({2, stage, 3, 3, at3});
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(*resumed, *straight) << "stage " << stage;
  }
}

TEST_F(Checkpoint, ReshardsFourToTwoToOneAndOneToFour) {
  const auto saved4 = Train({4, 3, 0, 3, "", Step(3)});
  ASSERT_TRUE(saved4.ok()) << saved4.status();
  // Loading alone reproduces the saved values exactly at any world size and stage.
  for (auto [world, stage] : {std::pair{2, 2}, {1, 0}, {3, 1}}) {
    const auto loaded = Train({world, stage, 3, 0, Step(3)});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(*loaded, *saved4) << "world " << world << " stage " << stage;
  }
  // 4 -> 2 -> 1, continuing training, tracks the uninterrupted 4-rank run within fp32 tolerance.
  const auto straight = Train({4, 3, 0, 9});
  ASSERT_TRUE(Train({2, 3, 3, 3, Step(3), Step(6)}).ok());
  const auto final1 = Train({1, 3, 6, 3, Step(6)});
  ASSERT_TRUE(final1.ok()) << final1.status();
  ASSERT_EQ(final1->size(), straight->size());
  for (size_t i = 0; i < final1->size(); ++i) EXPECT_NEAR((*final1)[i], (*straight)[i], 1e-5) << i;
  // 1 -> 4.
  ASSERT_TRUE(Train({1, 0, 0, 3, "", Step(30)}).ok());
  const auto a = Train({1, 0, 3, 3, Step(30)});
  const auto b = Train({4, 3, 3, 3, Step(30)});
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_NEAR((*a)[i], (*b)[i], 1e-5) << i;
}

TEST_F(Checkpoint, UnpublishedSaveIsNotMistakenForAComplete) {
  ASSERT_TRUE(Train({2, 3, 0, 2, "", Step(2)}).ok());
  ASSERT_TRUE(Train({2, 3, 2, 2, Step(2), Step(4)}).ok());
  // A process killed between writing its shards and publishing: the manifest never appeared.
  fs::remove(fs::path(Step(4)) / checkpoint::kManifestName);
  auto latest = checkpoint::ResolveCheckpoint(dir_.string());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Step(2));
  EXPECT_THAT(std::string(Train({2, 3, 4, 1, Step(4)}).status().message()), HasSubstr("no readable manifest"));
  EXPECT_TRUE(Train({2, 3, 2, 1, *latest}).ok()) << "the previous checkpoint stays loadable";
  // Saving again into the unpublished directory completes it; saving over a complete one is refused.
  EXPECT_TRUE(Train({2, 3, 2, 2, Step(2), Step(4)}).ok());
  EXPECT_EQ(Train({2, 3, 2, 2, Step(2), Step(4)}).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(Checkpoint, CorruptionsAreNamedErrors) {
  ASSERT_TRUE(Train({2, 3, 0, 1, "", Step(1)}).ok());
  const fs::path shard = fs::path(Step(1)) / "shard_00001.bin";
  auto copy = [&](const std::string& name) {
    const fs::path d = dir_ / name;
    fs::copy(Step(1), d, fs::copy_options::recursive);
    return d;
  };
  {  // a flipped byte in the data
    const fs::path d = copy("flipped");
    std::fstream f(d / "shard_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) - 5));
    f.put('\x5a');
    f.close();
    auto s = Train({2, 3, 1, 0, d.string()}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shard_00001.bin"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
  }
  {  // truncated
    const fs::path d = copy("truncated");
    fs::resize_file(d / "shard_00001.bin", fs::file_size(shard) / 2);
    auto s = Train({2, 3, 1, 0, d.string()}).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr("truncated")) << s;
  }
  {  // missing shard
    const fs::path d = copy("missing");
    fs::remove(d / "shard_00000.bin");
    auto s = Train({2, 3, 1, 0, d.string()}).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr("shard_00000.bin")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("missing")) << s;
  }
  {  // a manifest from a newer format
    const fs::path d = copy("newer");
    std::ifstream in(d / checkpoint::kManifestName);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    in.close();
    text.replace(text.find("\"version\": 1"), 12, "\"version\": 9");
    std::ofstream((d / checkpoint::kManifestName).string()) << text;
    auto s = Train({2, 3, 1, 0, d.string()}).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr("format version 9")) << s;
  }
  {  // another model, another dtype
    Plan other{2, 3, 1, 0, Step(1)};
    other.hidden = 40;
    EXPECT_THAT(std::string(Train(other).status().message()), HasSubstr("different model"));
    Plan bf16{2, 3, 1, 0, Step(1)};
    bf16.dtype = DType::kBF16;
    EXPECT_THAT(std::string(Train(bf16).status().message()), HasSubstr("param dtype fp32"));
  }
}

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Replaces the first `from` in `d`'s manifest with `to`.
void EditManifest(const fs::path& d, const std::string& from, const std::string& to) {
  std::string text = ReadText(d / checkpoint::kManifestName);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream((d / checkpoint::kManifestName).string()) << text;
}

std::vector<std::string> Temps(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") != std::string::npos) out.push_back(n);
  }
  return out;
}

TEST_F(Checkpoint, ResumeRefusesShardFilesOutsideTheStepDirectory) {
  ASSERT_TRUE(Train({2, 3, 0, 1, "", Step(1)}).ok());
  const fs::path outside = dir_ / "outside.bin";
  fs::rename(fs::path(Step(1)) / "shard_00001.bin", outside);  // a valid shard, moved out and referenced
  for (const std::string& name : {std::string("../outside.bin"), outside.string()}) {
    EditManifest(Step(1), name == outside.string() ? "\"../outside.bin\"" : "\"shard_00001.bin\"",
                 "\"" + name + "\"");
    auto s = Train({2, 3, 1, 0, Step(1)}).status();
    EXPECT_FALSE(s.ok()) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shards[1].file")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(name)) << s;
  }
  EditManifest(Step(1), absl::StrCat("\"", outside.string(), "\""),
               "\"shard_00001.bin\"");  // StrCat: GCC 12 -Wrestrict false positive
  fs::create_symlink("../outside.bin", fs::path(Step(1)) / "shard_00001.bin");
  auto s = Train({2, 3, 1, 0, Step(1)}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("shards[1].file")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("symlink"));
}

TEST_F(Checkpoint, HostileManifestsAreErrorsNotCrashes) {
  ASSERT_TRUE(Train({2, 3, 0, 1, "", Step(1)}).ok());
  const std::string good = ReadText(fs::path(Step(1)) / checkpoint::kManifestName);
  auto load_after = [&](const std::string& from, const std::string& to) {
    std::ofstream((fs::path(Step(1)) / checkpoint::kManifestName).string()) << good;
    EditManifest(Step(1), from, to);
    return Train({2, 3, 1, 0, Step(1)}).status();
  };
  EXPECT_THAT(std::string(load_after("\"step\": 1", "\"step\": \"1\"").message()), HasSubstr("field 'step'"));
  EXPECT_THAT(std::string(load_after("\"step\": 1", "\"step\": -1").message()), HasSubstr("field 'step'"));
  EXPECT_THAT(std::string(load_after("\"step\": 1", "\"step\": 2").message()), HasSubstr("past the step"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const size_t trainer = good.find("\"trainer\": ");
  ASSERT_NE(trainer, std::string::npos);
  EXPECT_THAT(std::string(load_after(good.substr(trainer), "\"trainer\": " + deep + "}").message()),
              HasSubstr("deeper than"));
  EXPECT_THAT(std::string(load_after("\"world_size\": 2", "\"world_size\": 3").message()),
              HasSubstr("lists 2 shards for world size 3"));
  EXPECT_TRUE(load_after("\"step\": 1", "\"step\": 1").ok()) << "the unedited manifest still loads";
}

TEST_F(Checkpoint, SaveRefusesATrainerStateTooDeepForTheManifest) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(EngineConfig{}, c, dev));
    STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*e, mlp::MlpShape{16, 48, 4}));
    (void)mlp;
    STRATA_RETURN_IF_ERROR(e->Finalize());
    return e->SaveCheckpoint(Step(0), deep);
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("trainer state JSON nests"));
  EXPECT_FALSE(fs::exists(fs::path(Step(0)) / checkpoint::kManifestName));
}

TEST_F(Checkpoint, FailedSaveLeavesNoTemporaries) {
  // Rank 1's shard cannot be renamed into place: its name is taken by a non-empty directory.
  fs::create_directories(fs::path(Step(2)) / "shard_00001.bin" / "x");
  auto s = Train({2, 3, 0, 2, "", Step(2)}).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 1 could not write their shard")) << s;
  EXPECT_THAT(Temps(Step(2)), ::testing::IsEmpty());
  EXPECT_FALSE(fs::exists(fs::path(Step(2)) / checkpoint::kManifestName));
}

// Note [Visible shards]: ranks that do not share the directory (node-local disks) never publish a manifest,
// and every rank names the shard rank 0 cannot see; a stale file of that name from another save fails too.
TEST_F(Checkpoint, ShardsRankZeroCannotSeeAreNeverPublished) {
  Plan p{2, 3, 0, 2, "", Step(2)};
  p.save_rank1 = (dir_ / "node1" / checkpoint::StepDirName(2)).string();
  auto s = Train(p).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0: checkpoint")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1: checkpoint")) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 wrote its shard 'shard_00001.bin' but rank 0 does not see it"));
  EXPECT_FALSE(fs::exists(fs::path(Step(2)) / checkpoint::kManifestName));
  // A shard of that name from an earlier save, in rank 0's view: its checksum is not the one rank 1 reported.
  ASSERT_TRUE(Train({2, 3, 0, 1, "", Step(1)}).ok());
  fs::remove_all(Step(2));
  fs::remove_all(p.save_rank1);
  fs::create_directories(Step(2));
  fs::copy_file(fs::path(Step(1)) / "shard_00001.bin", fs::path(Step(2)) / "shard_00001.bin");
  s = Train(p).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 does not see it")) << s;
  EXPECT_FALSE(fs::exists(fs::path(Step(2)) / checkpoint::kManifestName));
}

TEST_F(Checkpoint, SaveRemovesTemporariesADeadSaveLeft) {
  const fs::path d = Step(2);
  fs::create_directories(d);
  for (const char* n : {"shard_00000.bin.tmp.99999", "shard_00001.bin.tmp.1", "manifest.json.tmp.4242",
                        "shard_00007.bin.tmp.5", "notes.txt"}) {
    std::ofstream((d / n).string()) << "stale";
  }
  ASSERT_TRUE(Train({2, 3, 0, 2, "", Step(2)}).ok());
  EXPECT_THAT(Temps(d), ::testing::IsEmpty());
  EXPECT_TRUE(fs::exists(d / "notes.txt"));
  EXPECT_TRUE(Train({2, 3, 2, 0, Step(2)}).ok());
}

}  // namespace
}  // namespace strata::engine
