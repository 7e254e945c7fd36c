// Asynchronous checkpoints (Note [Asynchronous checkpoints], runtime/checkpoint/async_save.h): the files of
// SaveCheckpointAsync equal SaveCheckpoint's of the same state byte for byte (stages 0-3, 1 and 2 ranks,
// optimizer state in memory, on the host tier and on NVMe, hybrid sharding), also when the writers are held
// until training changed the state (the snapshot, not the live state, is written) and when a second snapshot
// reuses the first one's buffers; NVMe state is snapshotted without a host copy and the steps over the save
// leave it as a run without the save would; a write that fails in the background is returned by the next Step() (which
// is then not taken), by the next save (which does not start) and by WaitCheckpoint(), naming the step
// directory; destroying the engine finishes the save in flight; a second save waits for the first. On XFS the held
// tiles are cloned into the shard files, to the same bytes; a corrupt tile fails the save, cloned or streamed; a
// disk without room for the lanes fails the save and not the steps (decision 0057).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <latch>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/publish.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "runtime/offload/nvme_files.h"
#include "tests/files_under.h"
#include "tests/offload/offload_test_util.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;
using mlp::Mlp;
using ::testing::HasSubstr;

constexpr int kGlobalBatch = 8;

using strata::testing::FilesUnder;

absl::Status TrainSteps(Engine& e, Mlp& mlp, int rank, int world, int first, int steps) {
  const int micro = kGlobalBatch / world;
  for (int s = first; s < first + steps; ++s) {
    STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(e, int64_t{s} * kGlobalBatch + rank * micro, micro).status());
    STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
    STRATA_RETURN_IF_ERROR(e.Step().status());
  }
  return absl::OkStatus();
}

// Joins every rank's error.
absl::Status Joined(const std::vector<absl::Status>& results) {
  absl::Status first;
  std::string all;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    if (first.ok()) first = results[r];
    absl::StrAppend(&all, "rank ", r, ": ", results[r].message(), "\n");
  }
  return first.ok() ? first : absl::Status(first.code(), all);
}

// On `world` in-process ranks: an engine with `cfg` and the MLP, `steps` steps trained, then `body`; every
// rank's error joined.
absl::Status OnRanks(int world, const EngineConfig& cfg, int steps,
                     const std::function<absl::Status(int rank, Engine& e, Mlp& mlp)>& body,
                     const mlp::MlpShape& shape = {16, 48, 4}) {
  return Joined(testing::RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*e, shape));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    STRATA_RETURN_IF_ERROR(TrainSteps(*e, mlp, rank, world, 0, steps));
    return body(rank, *e, mlp);
  }));
}

class AsyncCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("async_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "nvme");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains 3 steps, saves synchronously into "sync" and asynchronously into "async" (the same state), then
  // trains 3 more steps while the async save's writers are held (SetBeforeAsyncWriteForTest) until every
  // rank took them, so the files are written after the state changed; then waits for it, and saves both ways
  // again (the second snapshot reuses the first one's buffers).
  // `started` (when set) runs on every rank right after the first asynchronous save returned.
  absl::Status SaveBoth(int world, const EngineConfig& cfg,
                        const std::function<absl::Status(Engine&)>& started = nullptr) {
    std::latch stepped(world);
    checkpoint::SetBeforeAsyncWriteForTest([&] { stepped.wait(); });
    absl::Status s = OnRanks(world, cfg, 3, [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
      STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((dir_ / "sync" / "a").string(), "{\"next_step\":3}"));
      STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((dir_ / "async" / "a").string(), "{\"next_step\":3}"));
      absl::Status checked = started ? started(e) : absl::OkStatus();
      if (!checked.ok()) stepped.count_down();  // release the writers before leaving
      STRATA_RETURN_IF_ERROR(checked);
      absl::Status trained = TrainSteps(e, mlp, rank, world, 3, 3);
      stepped.count_down();
      STRATA_RETURN_IF_ERROR(trained);
      STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
      // A second save, into the first one's snapshot buffers (TakeSpareBuffers).
      STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((dir_ / "sync" / "b").string(), "{\"next_step\":6}"));
      STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((dir_ / "async" / "b").string(), "{\"next_step\":6}"));
      return e.WaitCheckpoint();
    });
    checkpoint::SetBeforeAsyncWriteForTest(nullptr);
    return s;
  }

  EngineConfig Config(int stage) const {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.optimizer.lr = 1e-2;
    cfg.optimizer.weight_decay = 0.01;
    return cfg;
  }

  void ExpectSameFiles(const std::string& what) {
    const auto sync = FilesUnder(dir_ / "sync"), async = FilesUnder(dir_ / "async");
    ASSERT_FALSE(sync.empty()) << what;
    EXPECT_TRUE(sync.count("a/manifest.json") && sync.count("b/manifest.json")) << what;
    ASSERT_EQ(sync.size(), async.size()) << what;
    for (const auto& [name, bytes] : sync) {
      ASSERT_TRUE(async.count(name)) << what << ": " << name;
      EXPECT_TRUE(async.at(name) == bytes) << what << ": " << name << " differs";
    }
    fs::remove_all(dir_ / "sync");
    fs::remove_all(dir_ / "async");
  }

  fs::path dir_;
};

TEST_F(AsyncCheckpoint, EqualsTheSynchronousSaveByteForByte) {
  for (int world : {1, 2}) {
    for (int stage : {0, 1, 2, 3}) {
      const std::string what = absl::StrCat("world ", world, " stage ", stage);
      ASSERT_TRUE(SaveBoth(world, Config(stage)).ok()) << what;
      ExpectSameFiles(what);
    }
  }
}

// Hybrid sharding (decision 0016): only shard group 0 writes; the replicas take part in the publication.
TEST_F(AsyncCheckpoint, EqualsTheSynchronousSaveWithHybridSharding) {
  EngineConfig cfg = Config(3);
  cfg.shard_group_size = 2;
  const absl::Status s = SaveBoth(4, cfg);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(fs::exists(dir_ / "async" / "a" / "shard_00001.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "async" / "a" / "shard_00002.bin")) << "a replica wrote a shard";
  ExpectSameFiles("4 ranks, shard groups of 2");
}

TEST_F(AsyncCheckpoint, EqualsTheSynchronousSaveWithOffloadedOptimizerState) {
  for (OffloadDevice where : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (int world : {1, 2}) {
      EngineConfig cfg = Config(3);
      cfg.offload_optimizer.device = where;
      cfg.offload_optimizer.nvme_path = (dir_ / "nvme").string();
      cfg.offload_optimizer.pin_memory = false;
      cfg.nvme_tile_elems = 1024;
      const std::string what = absl::StrCat(where == OffloadDevice::kNvme ? "nvme" : "cpu", " world ", world);
      const absl::Status s = SaveBoth(world, cfg);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      ExpectSameFiles(what);
    }
  }
}

// Note [Snapshots of NVMe state]: with the optimizer state on NVMe the snapshot copies none of it into host
// memory (it holds the tiles, and the steps taken while the save is written go to fresh ones), at stages 1-3
// on 1 and 2 ranks; the files still equal the synchronous save's, and the state after those steps (saved
// synchronously after them) equals that of a run that never saved. With the state in host memory the snapshot
// holds the shard, as before.
TEST_F(AsyncCheckpoint, NvmeStateIsSavedWithoutAHostCopyAndTheStepsOverItAreUnchanged) {
  for (int world : {1, 2}) {
    for (int stage : {1, 2, 3}) {
      for (OffloadDevice where : {OffloadDevice::kNvme, OffloadDevice::kCpu}) {
        EngineConfig cfg = Config(stage);
        cfg.offload_optimizer.device = where;
        cfg.offload_optimizer.nvme_path = (dir_ / "nvme").string();
        cfg.offload_optimizer.pin_memory = false;
        cfg.nvme_tile_elems = 1024;
        const bool nvme = where == OffloadDevice::kNvme;
        const std::string what = absl::StrCat(nvme ? "nvme" : "cpu", " world ", world, " stage ", stage);
        const absl::Status s = SaveBoth(world, cfg, [&](Engine& e) -> absl::Status {
          const Engine::SnapshotBytes b = e.checkpoint_snapshot_bytes();
          const bool bounded = nvme ? b.host == 0 && b.nvme > 0 && b.staging == 4096 : b.host > 0 && b.nvme == 0;
          if (!bounded) {
            return absl::InternalError(
                absl::StrCat("snapshot bytes: host ", b.host, " nvme ", b.nvme, " staging ", b.staging));
          }
          return absl::OkStatus();
        });
        ASSERT_TRUE(s.ok()) << what << ": " << s;
        // The same six steps without any save before the last one.
        const absl::Status plain = OnRanks(world, cfg, 6, [&](int, Engine& e, Mlp&) -> absl::Status {
          return e.SaveCheckpoint((dir_ / "plain" / "b").string(), "{\"next_step\":6}");
        });
        ASSERT_TRUE(plain.ok()) << what << ": " << plain;
        const auto unsaved = FilesUnder(dir_ / "plain" / "b"), saved = FilesUnder(dir_ / "sync" / "b");
        ASSERT_FALSE(unsaved.empty()) << what;
        EXPECT_TRUE(unsaved == saved) << what << ": the steps taken over the save changed the state";
        fs::remove_all(dir_ / "plain");
        ExpectSameFiles(what);
      }
    }
  }
}

// `cfg` with the optimizer state on NVMe under `dir`/nvme, in tiles of 1024 elements.
// `name`: a small XFS with reflink for the clone paths (offload::testing::XfsMount), or the test skipped where there
// is none (failed where STRATA_REQUIRE_XFS=1 asks for one, as CI does).
#define XFS_OR_SKIP(name)                                                  \
  offload::testing::XfsMount name;                                         \
  if (!name.ok()) {                                                        \
    if (offload::testing::XfsMount::RequireXfs()) FAIL() << name.reason(); \
    GTEST_SKIP() << name.reason();                                         \
  }                                                                        \
  static_assert(true)

EngineConfig NvmeOn(EngineConfig cfg, const std::string& dir) {
  fs::create_directories(fs::path(dir) / "nvme");
  cfg.offload_optimizer.device = OffloadDevice::kNvme;
  cfg.offload_optimizer.nvme_path = dir + "/nvme";
  cfg.offload_optimizer.pin_memory = false;
  cfg.nvme_tile_elems = 1024;
  return cfg;
}

// Note [Cloned checkpoint lanes] (runtime/checkpoint/files.h): with the NVMe state and the checkpoints on one XFS,
// the asynchronous save clones the held tiles' whole blocks into its shard files (which then share blocks with the
// NVMe files) and still writes the synchronous save's files byte for byte, at stages 1 and 3 on 1 and 2 ranks,
// also when its writers are held until steps rewrote the state (those writes redirected to fresh tiles, and the
// shared blocks copied on write); the steps are those of a run that never saved. With the checkpoints on another
// file system the clone is refused (EXDEV) and the save streams the tiles, to the same bytes.
TEST_F(AsyncCheckpoint, ClonesTheHeldTilesWhereTheFileSystemSharesBlocks) {
  XFS_OR_SKIP(xfs);
  const mlp::MlpShape shape{64, 256, 16};  // lanes of many tiles of 1024 elements, most with a partial last block
  fs::create_directories(fs::path(xfs.path()) / "nvme");
  for (bool same_fs : {true, false}) {
    for (int world : {1, 2}) {
      for (int stage : {1, 3}) {
        EngineConfig cfg = Config(stage);
        cfg.offload_optimizer.device = OffloadDevice::kNvme;
        cfg.offload_optimizer.nvme_path = xfs.path() + "/nvme";
        cfg.offload_optimizer.pin_memory = false;
        cfg.nvme_tile_elems = 1024;
        const std::string what = absl::StrCat(same_fs ? "one file system" : "two", ", world ", world, " stage ", stage);
        const fs::path root = same_fs ? fs::path(xfs.path()) / "ckpt" : dir_ / "ckpt";
        std::vector<uint64_t> shared(world, 0);
        std::latch stepped(world);
        checkpoint::SetBeforeAsyncWriteForTest([&] {
          if (fs::exists(root / "async" / "a" / "manifest.json")) stepped.wait();  // the second save's writers
        });
        const absl::Status s = OnRanks(
            world, cfg, 3,
            [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
              STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((root / "sync" / "a").string(), "{}"));
              STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "async" / "a").string(), "{}"));
              STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
              shared[rank] =
                  offload::testing::SharedBytes((root / "async" / "a" / checkpoint::ShardName(rank)).string());
              STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, world, 3, 1));  // writes over the shared blocks
              STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((root / "sync" / "b").string(), "{}"));
              STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "async" / "b").string(), "{}"));
              absl::Status trained = TrainSteps(e, mlp, rank, world, 4, 2);  // over the held save
              stepped.count_down();
              STRATA_RETURN_IF_ERROR(trained);
              STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
              return e.SaveCheckpoint((root / "sync" / "c").string(), "{}");
            },
            shape);
        checkpoint::SetBeforeAsyncWriteForTest(nullptr);
        ASSERT_TRUE(s.ok()) << what << ": " << s;
        for (int r = 0; r < world; ++r) {
          if (same_fs) {
            EXPECT_GT(shared[r], 0u) << what << ": rank " << r << "'s shard shares no block: nothing was cloned";
          } else {
            EXPECT_EQ(shared[r], 0u) << what << ": rank " << r;
          }
        }
        for (const char* step : {"a", "b"}) {
          const auto sync = FilesUnder(root / "sync" / step), async = FilesUnder(root / "async" / step);
          ASSERT_FALSE(sync.empty()) << what;
          EXPECT_TRUE(sync == async) << what << ": save " << step << " differs from the synchronous one";
        }
        const absl::Status plain = OnRanks(
            world, cfg, 6,
            [&](int, Engine& e, Mlp&) -> absl::Status { return e.SaveCheckpoint((root / "plain").string(), "{}"); },
            shape);
        ASSERT_TRUE(plain.ok()) << what << ": " << plain;
        EXPECT_TRUE(FilesUnder(root / "plain") == FilesUnder(root / "sync" / "c"))
            << what << ": the steps over the saves changed the state";
        fs::remove_all(root);
      }
    }
  }
}

// Decision 0058: the writer holds the cloned tiles until the steps over the save read them (the store checks every
// read), and reads back only the pieces its CRCs need; a save waited for at once (nobody will read its tiles) reads
// every tile back itself, and equals the synchronous save of the same state.
TEST_F(AsyncCheckpoint, TheStepsOverAClonedSaveCheckItsTilesAndAWaitReadsThemBack) {
  XFS_OR_SKIP(xfs);
  const mlp::MlpShape shape{64, 256, 16};
  const EngineConfig cfg = NvmeOn(Config(3), xfs.path());
  const fs::path root = fs::path(xfs.path()) / "ckpt";
  constexpr int kWorld = 2;
  std::vector<Engine::CloneCounts> waited(kWorld), stepped(kWorld);
  std::vector<uint64_t> held(kWorld);
  const absl::Status s = OnRanks(
      kWorld, cfg, 3,
      [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
        STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "waited").string(), "{}"));
        STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());  // at once: nobody reads the tiles
        waited[rank] = e.checkpoint_clones();
        held[rank] = e.checkpoint_snapshot_bytes().nvme;
        STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((root / "sync").string(), "{}"));
        STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, kWorld, 3, 1));  // tiles rewritten: unchecked again
        STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "stepped").string(), "{}"));
        STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, kWorld, 4, 1));  // reads, so checks, every tile
        STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
        stepped[rank] = e.checkpoint_clones();
        return absl::OkStatus();
      },
      shape);
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_GT(waited[r].tiles, 0u) << "rank " << r << ": nothing was cloned";
    EXPECT_EQ(waited[r].checked_by_steps, 0u) << "rank " << r;
    EXPECT_GE(waited[r].read_back_bytes, held[r] / 2) << "rank " << r << ": the tiles were not read back";
    EXPECT_EQ(stepped[r].tiles, waited[r].tiles) << "rank " << r;
    EXPECT_EQ(stepped[r].checked_by_steps, stepped[r].tiles) << "rank " << r << ": the step's reads checked none";
    EXPECT_LT(stepped[r].read_back_bytes, held[r] / 4) << "rank " << r << ": more than the CRCs' pieces read back";
  }
  EXPECT_TRUE(FilesUnder(root / "waited") == FilesUnder(root / "sync"));
}

// A corrupt NVMe tile (every byte of the optimizer's files flipped on disk) fails the asynchronous save with
// DataLoss naming the checkpoint, cloned (the cloned tiles are checked against the store's checksums, decision
// 0057) or streamed (the store's read checks them), and nothing is published.
TEST_F(AsyncCheckpoint, ACorruptTileFailsTheSaveClonedOrStreamed) {
  XFS_OR_SKIP(xfs);
  for (bool cloned : {true, false}) {
    const fs::path base = cloned ? fs::path(xfs.path()) : dir_;
    fs::create_directories(base / "nvme");
    EngineConfig cfg = Config(3);
    cfg.offload_optimizer.device = OffloadDevice::kNvme;
    cfg.offload_optimizer.nvme_path = (base / "nvme").string();
    cfg.offload_optimizer.pin_memory = false;
    cfg.nvme_tile_elems = 1024;
    const fs::path step = base / "ckpt" / "a";
    const absl::Status s =
        OnRanks(1, cfg, 3,
                [&](int, Engine& e, Mlp&) -> absl::Status {
                  const std::string dir = fs::canonical(base / "nvme").string() + "/";
                  int flipped = 0;
                  for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
                    std::error_code ec;
                    const std::string target = fs::read_symlink(fd.path(), ec).string();
                    if (ec || target.rfind(dir, 0) != 0 || target.find("optimizer") == std::string::npos) continue;
                    std::FILE* fp = std::fopen(fd.path().c_str(), "r+b");
                    if (fp == nullptr) continue;
                    std::vector<char> bytes(fs::file_size(fd.path()));
                    const bool read = std::fread(bytes.data(), 1, bytes.size(), fp) == bytes.size();
                    for (char& b : bytes) b = static_cast<char>(~b);
                    std::rewind(fp);
                    const bool wrote = read && std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size();
                    std::fclose(fp);
                    flipped += wrote ? 1 : 0;
                  }
                  if (flipped == 0) return absl::InternalError("found no optimizer file to corrupt");
                  STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync(step.string(), "{}"));
                  return e.WaitCheckpoint();
                },
                {64, 256, 16});
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << (cloned ? "cloned: " : "streamed: ") << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(step.string()));
    EXPECT_FALSE(fs::exists(step / "manifest.json")) << "a corrupt save was published";
    fs::remove_all(base / "ckpt");
  }
}

// Room first (decision 0057): with less room on the XFS than the NVMe lanes need, the asynchronous save does not
// clone (a clone's blocks take their room when the steps rewrite them, and the steps would fail for want of it): it
// streams and fails for want of room, the wait reports it, naming the step directory, and the steps after it
// (which write every tile) go on, to the state of a run that never saved.
TEST_F(AsyncCheckpoint, ANearlyFullFileSystemFailsTheSaveNotTheSteps) {
  XFS_OR_SKIP(xfs);
  const mlp::MlpShape shape{64, 256, 16};  // about 1 MB of lanes (3 kinds)
  const EngineConfig cfg = NvmeOn(Config(3), xfs.path());
  const fs::path root = fs::path(xfs.path()) / "ckpt", filler = fs::path(xfs.path()) / "filler";
  const absl::Status s = OnRanks(
      1, cfg, 3,
      [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
        fs::create_directories(root);
        const uint64_t free = fs::space(root).available, leave = 256 << 10;
        const int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0 || ::fallocate(fd, 0, 0, static_cast<off_t>(free - leave)) != 0) {
          return absl::InternalError(absl::StrCat("cannot fill the XFS: ", std::strerror(errno)));
        }
        ::close(fd);
        STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "a").string(), "{}"));
        const absl::Status waited = e.WaitCheckpoint();
        if (waited.ok() || !absl::StrContains(waited.message(), (root / "a").string())) {
          return absl::InternalError(absl::StrCat("the save into a full disk returned: ", waited.ToString()));
        }
        STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, 1, 3, 3));  // writing every tile: these must not fail
        fs::remove(filler);
        return e.SaveCheckpoint((root / "after").string(), "{}");
      },
      shape);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(fs::exists(root / "a" / "manifest.json")) << "a failed save was published";
  const absl::Status plain = OnRanks(
      1, cfg, 6,
      [&](int, Engine& e, Mlp&) -> absl::Status { return e.SaveCheckpoint((root / "plain").string(), "{}"); }, shape);
  ASSERT_TRUE(plain.ok()) << plain;
  EXPECT_TRUE(FilesUnder(root / "plain") == FilesUnder(root / "after")) << "the steps over the failed save changed";
}

// Note [Cloned checkpoint lanes]: ranks whose NVMe state and checkpoints share one file system share its room. With
// room for one rank's clones and a half, each rank alone had room for its own, so both cloned, and the steps that
// rewrote the clones ran out of room (ENOSPC writing an NVMe tile: training stopped). Now the ranks count each
// other's clones: neither clones, the save streams into the room it lacks and fails naming its directory, and the
// steps after it train on.
TEST_F(AsyncCheckpoint, RanksSharingAFileSystemCloneOnlyWhereItHoldsAllTheirClones) {
  XFS_OR_SKIP(xfs);
  const mlp::MlpShape shape{64, 256, 16};
  const EngineConfig cfg = NvmeOn(Config(3), xfs.path());
  const fs::path root = fs::path(xfs.path()) / "ckpt", filler = fs::path(xfs.path()) / "filler";
  fs::create_directories(root);
  std::vector<uint64_t> lanes(2);
  std::vector<Engine::CloneCounts> clones(2);
  std::latch probed(2), filled(2);
  const absl::Status s = OnRanks(
      2, cfg, 2,
      [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
        // What each rank's clones take: a save's NVMe bytes (its lanes' tiles).
        STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "probe").string(), "{}"));
        STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
        lanes[rank] = e.checkpoint_snapshot_bytes().nvme;
        probed.arrive_and_wait();
        if (rank == 0) {
          fs::remove_all(root / "probe");
          const uint64_t free = fs::space(root).available;
          const uint64_t leave = std::max(lanes[0], lanes[1]) * 3 / 2;
          const int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
          if (lanes[0] == 0 || free < leave || fd < 0 || ::fallocate(fd, 0, 0, static_cast<off_t>(free - leave)) != 0) {
            filled.arrive_and_wait();
            return absl::InternalError(absl::StrCat("cannot fill the XFS: ", std::strerror(errno)));
          }
          ::close(fd);
        }
        filled.arrive_and_wait();
        // Waited for before the steps, so a failed save is not also the next step's error; a clone outlives it in
        // the published checkpoint, and the steps after it rewrite its blocks.
        STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "a").string(), "{}"));
        const absl::Status waited = e.WaitCheckpoint();
        clones[rank] = e.checkpoint_clones();
        if (!waited.ok() && !absl::StrContains(waited.message(), (root / "a").string())) return waited;
        return TrainSteps(e, mlp, rank, 2, 2, 3);  // rewriting every tile: these must not fail
      },
      shape);
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) EXPECT_EQ(clones[r].tiles, 0u) << "rank " << r << " cloned";
}

// A disk with room for the NVMe state once but not twice (Note [Snapshots of NVMe state]): the engine
// preallocates it once, where Finalize failed with ENOSPC before, and an asynchronous save with steps taken
// over it (which then find no room for a redirect and wait for the writer) still writes the synchronous save's
// files, and the steps after it are those of a run with room.
TEST_F(AsyncCheckpoint, NvmeStateWithRoomForItOnceStillTrainsAndSaves) {
  EngineConfig cfg = Config(3);
  cfg.offload_optimizer.device = OffloadDevice::kNvme;
  cfg.offload_optimizer.nvme_path = (dir_ / "nvme").string();
  cfg.offload_optimizer.pin_memory = false;
  cfg.nvme_tile_elems = 1024;
  uint64_t state_bytes = 0;
  auto saves = [&](const fs::path& root) {
    return OnRanks(1, cfg, 3, [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
      STRATA_RETURN_IF_ERROR(e.SaveCheckpoint((root / "sync").string(), "{\"next_step\":3}"));
      STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "async").string(), "{\"next_step\":3}"));
      state_bytes = e.checkpoint_snapshot_bytes().nvme;
      STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, 1, 3, 3));
      STRATA_RETURN_IF_ERROR(e.WaitCheckpoint());
      return e.SaveCheckpoint((root / "after").string(), "{\"next_step\":6}");
    });
  };
  const absl::Status roomy = saves(dir_ / "roomy");
  ASSERT_TRUE(roomy.ok()) << roomy;
  ASSERT_GT(state_bytes, 0u);
  // Room for the state and a half (whole pages): not for twice it.
  const uint64_t room = (state_bytes * 3 / 2 + 4095) / 4096 * 4096;
  offload::testing::TmpfsMount small(absl::StrCat("size=", room));
  if (!small.ok()) GTEST_SKIP() << small.reason();
  cfg.offload_optimizer.nvme_path = small.path();
  const absl::Status tight = saves(dir_ / "tight");
  ASSERT_TRUE(tight.ok()) << "with room for the state once (" << room << " bytes for " << state_bytes
                          << " of state): " << tight;
  for (const char* name : {"sync", "async", "after"}) {
    const auto a = FilesUnder(dir_ / "roomy" / name), b = FilesUnder(dir_ / "tight" / name);
    ASSERT_FALSE(a.empty()) << name;
    EXPECT_EQ(a.size(), b.size()) << name;
    for (const auto& [file, bytes] : a) {
      EXPECT_TRUE(b.count(file) && b.at(file) == bytes) << name << "/" << file << " differs";
    }
  }
}

// Note [NVMe room agreed] (runtime/engine/engine.cc): the room for the state's redirects (twice the state) is taken
// only once every store of every rank holds what it needs. On a disk with room for every store once and some
// room over, but not for twice the state: one rank whose parameter shards are on NVMe too (before, the state's
// store took twice the state and the parameter store found no room), and two ranks sharing the disk (before, the
// first rank to preallocate twice its state left the other without room for its state once). Each trains and
// saves asynchronously with steps over the save, and the disk holds no more than it had.
TEST_F(AsyncCheckpoint, StoresSharingADiskEachGetWhatTheyNeedBeforeAnyGetsRoomToSpare) {
  EngineConfig cfg = Config(3);
  cfg.offload_optimizer.device = OffloadDevice::kNvme;
  cfg.offload_optimizer.pin_memory = false;
  cfg.offload_param.pin_memory = false;
  cfg.nvme_tile_elems = 1024;
  // The disk bytes the stores of `world` ranks take on a roomy tmpfs, with the state's (and the params') on it.
  auto used = [&](int world, bool params) -> uint64_t {
    constexpr uint64_t kRoomy = uint64_t{256} << 20;
    offload::testing::TmpfsMount roomy(absl::StrCat("size=", kRoomy));
    if (!roomy.ok()) return 0;
    EngineConfig c = cfg;
    c.offload_param.device = params ? OffloadDevice::kNvme : OffloadDevice::kNone;
    c.offload_optimizer.nvme_path = c.offload_param.nvme_path = roomy.path();
    uint64_t bytes = 0;
    std::latch finalized(world), measured(world);  // no rank's engine, and stores, gone before rank 0 measured
    const absl::Status s = OnRanks(world, c, 1, [&](int rank, Engine&, Mlp&) -> absl::Status {
      finalized.arrive_and_wait();
      if (rank == 0) bytes = kRoomy - offload::FreeBytes(roomy.path());
      measured.arrive_and_wait();
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    return bytes;
  };
  for (const int world : {1, 2}) {
    const uint64_t twice_state = used(world, false), both = used(world, true);
    if (twice_state == 0) GTEST_SKIP() << "no tmpfs mount (needs root)";
    ASSERT_GT(both, twice_state);
    const uint64_t state = twice_state / 2, params = both - twice_state;
    // One rank: room for twice the state and half the params (twice the state first left the params none).
    // Two ranks: room for the state once and a quarter more (one rank's twice its state left the other none).
    const uint64_t room = (world == 1 ? 2 * state + params / 2 : state + state / 4 + params) / 4096 * 4096;
    offload::testing::TmpfsMount tight(absl::StrCat("size=", room));
    ASSERT_TRUE(tight.ok()) << tight.reason();
    cfg.offload_optimizer.nvme_path = cfg.offload_param.nvme_path = tight.path();
    cfg.offload_param.device = OffloadDevice::kNvme;
    const fs::path root = dir_ / absl::StrCat("world", world);
    const absl::Status s = OnRanks(world, cfg, 2, [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
      STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((root / "async").string(), "{\"next_step\":2}"));
      STRATA_RETURN_IF_ERROR(TrainSteps(e, mlp, rank, world, 2, 2));
      return e.WaitCheckpoint();
    });
    EXPECT_TRUE(s.ok()) << world << " rank(s), " << room << " bytes of disk for " << state << " bytes of state and "
                        << params << " of params: " << s;
    EXPECT_TRUE(fs::exists(root / "async" / "manifest.json")) << world;
    EXPECT_EQ(offload::FreeBytes(tight.path()), room) << "the stores left the disk as they found it";
  }
}

// Note [NVMe room agreed]: a rank that cannot make its NVMe stores (here rank 1's path does not exist) fails with its
// own error, and the rank that made them fails naming it (before, it went on, to wait for rank 1 in its first step).
TEST_F(AsyncCheckpoint, ARankWithoutItsNvmeStoresFailsTheOthersByName) {
  const std::vector<absl::Status> results =
      testing::RunRanks(2, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
        EngineConfig cfg = Config(3);
        cfg.offload_optimizer.device = OffloadDevice::kNvme;
        cfg.offload_optimizer.pin_memory = false;
        cfg.offload_optimizer.nvme_path = (dir_ / (rank == 0 ? "nvme" : "missing")).string();
        device::HostDevice dev;
        STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
        STRATA_RETURN_IF_ERROR(Mlp::Register(*e, {16, 48, 4}).status());
        return e->Finalize();
      });
  EXPECT_TRUE(absl::IsNotFound(results[1])) << results[1];
  EXPECT_THAT(results[1].message(), HasSubstr((dir_ / "missing").string()));
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("rank 1 could not reserve its memory and NVMe stores"));
}

// A shard that cannot be renamed into place (a directory holds its name) fails on the writer thread.
TEST_F(AsyncCheckpoint, AFailedWriteIsReturnedByTheNextStepSaveAndWait) {
  const fs::path bad = dir_ / "bad";
  fs::create_directories(bad / "shard_00001.bin" / "in_the_way");
  const absl::Status s = OnRanks(2, Config(3), 1, [&](int rank, Engine& e, Mlp& mlp) -> absl::Status {
    STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync(bad.string(), "{}"));  // returns before the write
    while (e.checkpoint_in_flight()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // The next step returns the failure, naming the directory, and is not taken: the step count stays.
    STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(e, 8 + rank * 4, 4).status());
    STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
    const int64_t before = e.step();
    auto failed = e.Step();
    if (failed.ok()) return absl::InternalError("the step after a failed asynchronous save succeeded");
    const std::string message(failed.status().message());
    if (!absl::StrContains(message, bad.string()) || !absl::StrContains(message, "was not published")) {
      return absl::InternalError(absl::StrCat("the step's error does not name the save: ", message));
    }
    if (e.step() != before) return absl::InternalError("the failed save's step was taken");
    STRATA_RETURN_IF_ERROR(e.Step().status());  // called again, it is taken
    if (e.step() != before + 1) return absl::InternalError("the step was not taken the second time");
    // WaitCheckpoint still tells the last save's outcome.
    if (e.WaitCheckpoint().ok()) return absl::InternalError("WaitCheckpoint() after a failed save is OK");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(fs::exists(bad / checkpoint::kManifestName)) << "a failed save published its manifest";

  // The next save returns an unreported failure and does not start.
  fs::remove_all(bad);
  fs::create_directories(bad / "shard_00000.bin" / "in_the_way");
  const fs::path next = dir_ / "next";
  const absl::Status t = OnRanks(2, Config(2), 1, [&](int, Engine& e, Mlp&) -> absl::Status {
    STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync(bad.string(), "{}"));
    const absl::Status second = e.SaveCheckpointAsync(next.string(), "{}");
    if (second.ok()) return absl::InternalError("a save after a failed one started");
    if (!absl::StrContains(second.message(), bad.string()) || !absl::StrContains(second.message(), next.string())) {
      return absl::InternalError(absl::StrCat("the second save's error names the wrong paths: ", second.message()));
    }
    // Reported once: a save after that starts and completes.
    STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync(next.string(), "{}"));
    return e.WaitCheckpoint();
  });
  ASSERT_TRUE(t.ok()) << t;
  EXPECT_TRUE(fs::exists(next / checkpoint::kManifestName));
}

TEST_F(AsyncCheckpoint, DestroyingTheEngineFinishesTheSaveAndSavesQueue) {
  // Two saves back to back (the second waits for the first), then the engine goes away with "b" maybe in
  // flight.
  const absl::Status s = OnRanks(2, Config(3), 1, [&](int, Engine& e, Mlp&) -> absl::Status {
    STRATA_RETURN_IF_ERROR(e.SaveCheckpointAsync((dir_ / "a").string(), "{\"next_step\":1}"));
    return e.SaveCheckpointAsync((dir_ / "b").string(), "{\"next_step\":1}");
  });
  ASSERT_TRUE(s.ok()) << s;
  const auto a = FilesUnder(dir_ / "a"), b = FilesUnder(dir_ / "b");
  ASSERT_TRUE(a.count(checkpoint::kManifestName));
  ASSERT_TRUE(b.count(checkpoint::kManifestName));
  EXPECT_TRUE(a == b);
  // And it loads.
  const absl::Status load = OnRanks(1, Config(1), 0, [&](int, Engine& e, Mlp&) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(std::string trainer, e.LoadCheckpoint((dir_ / "b").string()));
    if (trainer != "{\"next_step\":1}") return absl::InternalError("trainer state: " + trainer);
    return absl::OkStatus();
  });
  EXPECT_TRUE(load.ok()) << load;
}

}  // namespace
}  // namespace strata::engine
