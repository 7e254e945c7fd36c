// Frozen units (Note [Frozen units] in runtime/engine/placement.h): a model whose frozen half is
// gathered, never reduced or updated and costs only its parameter bytes. Checked at stages 0-3, 1 and 2
// ranks, fp32 and bf16, with and without the optimizer offloaded: the frozen params are bit for bit
// untouched after several steps; the trainable half is bit for bit the run of the same trainable units
// with the frozen half as constants; the tracked bytes of the frozen half are exactly its parameter
// bytes; checkpoints save only its values (format 2), restore them bit for bit at another world size and
// stage, and export them; an asynchronous save holds them in place, not copied; a unit that mixes frozen and
// trainable parameters is refused.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <latch>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "runtime/offload/nvme_store.h"
#include "tests/files_under.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;
using shard::Init;
using shard::ParamSpec;
using ::testing::HasSubstr;

// Two pairs of units: a frozen "base" F_k and a trainable "adapter" T_k whose gradient depends on F_k's
// values (the frozen half is not dead weight). The trainable units are the larger ones, so the shared
// pools (sized by the largest unit) are the same with and without the frozen half.
constexpr int kPairs = 2;
constexpr int64_t kFrozenElems = 37, kTrainElems = 70;

std::vector<ParamSpec> FrozenSpecs() {
  return {ParamSpec{"w", {kFrozenElems}, true, Init::Normal(0.5f), true},
          ParamSpec{"b", {5}, false, Init::Uniform(0.3f), true}};
}
std::vector<ParamSpec> TrainSpecs() {
  return {ParamSpec{"w", {7, 10}, true, Init::Normal(0.2f)}, ParamSpec{"b", {3}, false, Init::Zeros()}};
}

float Load(const ParamView& v, size_t i) {
  if (v.dtype == DType::kF32) return static_cast<const float*>(v.data)[i];
  return kernels::Bf16ToFloat(static_cast<const uint16_t*>(v.data)[i]);
}

struct Plan {
  int world = 1, stage = 0;
  DType dtype = DType::kF32;
  OffloadDevice offload = OffloadDevice::kNone;
  bool with_frozen = true;  // else the frozen values are the constants below
  int steps = 4;
  std::string save, load;  // step directories
  uint64_t seed = 1;       // of the initial values (a load must replace every one of them)
  std::string nvme;        // a directory: optimizer state and (stage 3) parameter shards on NVMe there
  bool in_backward = false;  // strata.optimizer_in_backward
  bool clip = true;          // gradient clipping (the update in backward refuses it)
  // After the save: an asynchronous save of the same state there, whose writers wait for `release` when set;
  // meanwhile SetParam gives every element of base0.w the value kSetDuringSave (with `release` only).
  std::string async_save;
  std::latch* release = nullptr;
};

constexpr float kSetDuringSave = 0.25f;

struct Result {
  std::vector<std::vector<float>> frozen_before, frozen_after, trained;  // per pair, rank 0's GatherUnit
  std::vector<std::vector<float>> seen;  // per pair: the frozen w values the trainer saw (first forward)
  MemoryStats memory;
  std::vector<size_t> frozen_param_bytes;  // per pair: what the rank's param storage of F_k holds
  Engine::SnapshotBytes snapshot;          // the asynchronous save's
  std::vector<float> base0_after_save;     // base0 gathered after the asynchronous save (with `release`)
};

EngineConfig ConfigOf(const Plan& r) {
  EngineConfig cfg;
  cfg.stage = r.stage;
  cfg.param_dtype = r.dtype;
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.weight_decay = 0.1;
  cfg.gradient_clipping = r.clip ? 0.05 : 0;  // active: the norm must leave the frozen half out
  cfg.max_live_units = 2;
  cfg.offload_optimizer.device = r.offload;
  cfg.seed = r.seed;
  cfg.optimizer_in_backward = r.in_backward;
  if (!r.nvme.empty()) {
    cfg.offload_optimizer.device = OffloadDevice::kNvme;
    cfg.offload_optimizer.nvme_path = r.nvme;
    cfg.offload_optimizer.pin_memory = false;
    if (r.stage == 3) {
      cfg.offload_param.device = OffloadDevice::kNvme;
      cfg.offload_param.nvme_path = r.nvme;
      cfg.offload_param.pin_memory = false;
    }
  }
  return cfg;
}

// Runs r.steps steps. `constants` (per pair) stand for the frozen values when !r.with_frozen.
absl::StatusOr<Result> Train(const Plan& r, const std::vector<std::vector<float>>& constants = {}) {
  Result out;
  std::mutex mu;
  const EngineConfig cfg = ConfigOf(r);
  auto results = testing::RunRanks(r.world, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    std::vector<int> frozen(kPairs, -1), train(kPairs, -1);
    for (int k = 0; k < kPairs; ++k) {
      if (r.with_frozen) {
        STRATA_ASSIGN_OR_RETURN(frozen[k], e->RegisterUnit(absl::StrCat("base", k), FrozenSpecs()));
      }
      STRATA_ASSIGN_OR_RETURN(train[k], e->RegisterUnit(absl::StrCat("adapter", k), TrainSpecs()));
    }
    STRATA_RETURN_IF_ERROR(e->Finalize());
    if (!r.load.empty()) STRATA_RETURN_IF_ERROR(e->LoadCheckpoint(r.load).status());
    Result mine;
    for (int k = 0; k < kPairs && r.with_frozen; ++k) {
      STRATA_ASSIGN_OR_RETURN(std::vector<float> v, e->GatherUnit(frozen[k]));
      mine.frozen_before.push_back(std::move(v));
      const shard::UnitLayout& l = e->layout(frozen[k]);
      mine.frozen_param_bytes.push_back((r.stage == 3 ? l.shard_elems : l.total_elems) * DTypeBytes(r.dtype));
    }
    std::vector<std::vector<float>> seen(kPairs, std::vector<float>(kFrozenElems));
    if (!r.with_frozen) seen = constants;
    // One step. scribble: base0's forward negates its w in place, as a model's forward may write a frozen
    // parameter (nn.Embedding(max_norm) renormalises the rows it looks up).
    auto one_step = [&](int s, bool scribble) -> absl::Status {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      for (int k = 0; k < kPairs; ++k) {
        if (r.with_frozen) {
          STRATA_RETURN_IF_ERROR(e->BeginForward(frozen[k]));
          const ParamView w = e->Param(frozen[k], 0);
          for (size_t i = 0; i < w.numel; ++i) seen[k][i] = Load(w, i);
          for (size_t i = 0; scribble && k == 0 && i < w.numel; ++i) {
            if (w.dtype == DType::kF32) static_cast<float*>(w.data)[i] = -seen[k][i];
            if (w.dtype != DType::kF32) static_cast<uint16_t*>(w.data)[i] ^= 0x8000;  // the sign bit
          }
          STRATA_RETURN_IF_ERROR(e->EndForward(frozen[k]));
        }
        STRATA_RETURN_IF_ERROR(e->BeginForward(train[k]));
        STRATA_RETURN_IF_ERROR(e->EndForward(train[k]));
      }
      if (s == 0) mine.seen = seen;
      for (int k = kPairs - 1; k >= 0; --k) {
        STRATA_RETURN_IF_ERROR(e->BeginBackward(train[k]));
        const ParamView w = e->Param(train[k], 0);
        float* gw = e->Grad(train[k], 0);
        float* gb = e->Grad(train[k], 1);
        for (size_t i = 0; i < w.numel; ++i) {
          gw[i] += 0.05f * (Load(w, i) - seen[k][i % kFrozenElems]) + 0.001f * (rank + 1) * float(int(i % 7) - 3);
        }
        for (int i = 0; i < 3; ++i) gb[i] += 0.01f * (rank + 1) * (i + 1);
        STRATA_RETURN_IF_ERROR(e->EndBackward(train[k]));
        if (r.with_frozen) {
          STRATA_RETURN_IF_ERROR(e->BeginBackward(frozen[k]));
          if (e->Param(frozen[k], 0).data == nullptr)
            return absl::InternalError("frozen params not gathered in backward");
          for (int p = 0; p < 2; ++p) {
            if (e->Grad(frozen[k], p) != nullptr) return absl::InternalError("a frozen unit has a gradient buffer");
          }
          STRATA_RETURN_IF_ERROR(e->EndBackward(frozen[k]));
        }
      }
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      return e->Step().status();
    };
    for (int s = 0; s < r.steps; ++s) STRATA_RETURN_IF_ERROR(one_step(s, false));
    for (int k = 0; k < kPairs; ++k) {
      if (r.with_frozen) {
        STRATA_ASSIGN_OR_RETURN(std::vector<float> v, e->GatherUnit(frozen[k]));
        mine.frozen_after.push_back(std::move(v));
      }
      STRATA_ASSIGN_OR_RETURN(std::vector<float> t, e->GatherUnit(train[k]));
      mine.trained.push_back(std::move(t));
    }
    mine.memory = e->memory_stats();
    if (!r.save.empty()) STRATA_RETURN_IF_ERROR(e->SaveCheckpoint(r.save, "{}"));
    if (!r.async_save.empty()) {
      STRATA_RETURN_IF_ERROR(e->SaveCheckpointAsync(r.async_save, "{}"));
      mine.snapshot = e->checkpoint_snapshot_bytes();
      if (r.release != nullptr) {
        // The writers are held until each rank's timer ran out: a step whose forward writes base0 in place,
        // then SetParam, which returns only after the writers where they hold base0 in place.
        STRATA_RETURN_IF_ERROR(one_step(r.steps, /*scribble=*/true));
        std::thread timer([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          r.release->count_down();
        });
        const absl::Status set = e->SetParam(frozen[0], 0, std::vector<float>(kFrozenElems, kSetDuringSave));
        timer.join();
        STRATA_RETURN_IF_ERROR(set);
      }
      STRATA_RETURN_IF_ERROR(e->WaitCheckpoint());
      if (r.release != nullptr) {
        STRATA_ASSIGN_OR_RETURN(mine.base0_after_save, e->GatherUnit(frozen[0]));
      }
    }
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(mine);
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

std::string Name(const Plan& r) {
  return absl::StrCat("stage ", r.stage, ", ", r.world, " rank(s), ", DTypeName(r.dtype),
                      r.offload == OffloadDevice::kCpu ? ", offload_optimizer cpu" : "",
                      r.nvme.empty() ? "" : ", nvme");
}

// Every stage from `first_stage`, 1 and 2 ranks, fp32 and bf16, offload none and cpu.
std::vector<Plan> Cases(int first_stage = 0) {
  std::vector<Plan> runs;
  for (int world : {1, 2}) {
    for (int stage = first_stage; stage <= 3; ++stage) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (OffloadDevice off : {OffloadDevice::kNone, OffloadDevice::kCpu}) {
          if (stage == 0 && off == OffloadDevice::kCpu) continue;  // offload_optimizer needs stage >= 1 (config.cc)
          Plan r;
          r.world = world;
          r.stage = stage;
          r.dtype = dtype;
          r.offload = off;
          runs.push_back(r);
        }
      }
    }
  }
  return runs;
}

// Trains `run` and the same run with the frozen half replaced by the values it saw: the frozen half must
// come out bit for bit untouched and the trainable half equal to the run with constants. Returns the run.
absl::StatusOr<Result> TrainAndCompareWithConstants(const Plan& run) {
  STRATA_ASSIGN_OR_RETURN(Result a, Train(run));
  for (int k = 0; k < kPairs; ++k) {
    if (a.frozen_before[k].size() != a.frozen_after[k].size()) return absl::InternalError("frozen unit resized");
    EXPECT_EQ(0, std::memcmp(a.frozen_before[k].data(), a.frozen_after[k].data(), a.frozen_before[k].size() * 4))
        << "frozen unit base" << k << " changed";
  }
  Plan constants = run;
  constants.with_frozen = false;
  STRATA_ASSIGN_OR_RETURN(Result b, Train(constants, a.seen));
  for (int k = 0; k < kPairs; ++k) {
    if (a.trained[k].size() != b.trained[k].size()) return absl::InternalError("trainable unit sizes differ");
    EXPECT_EQ(0, std::memcmp(a.trained[k].data(), b.trained[k].data(), a.trained[k].size() * 4))
        << "adapter" << k << " differs from the run with constants";
    EXPECT_NE(a.trained[k][0], 0.0f);
  }
  return a;
}

std::string NvmeDir() {
  const std::string dir = ::testing::TempDir() + "/frozen_nvme_" + std::to_string(::getpid());
  fs::create_directories(dir);
  return dir;
}

// Cases(), then the NVMe tiers at stages 1 and 3 (2 ranks, bf16): the frozen half has no lanes there, and at
// stage 3 its shards are in the NVMe parameter cache.
std::vector<Plan> CasesAndNvme() {
  std::vector<Plan> runs = Cases();
  for (int stage : {1, 3}) {
    Plan r;
    r.world = 2;
    r.stage = stage;
    r.dtype = DType::kBF16;
    r.nvme = NvmeDir();
    runs.push_back(r);
  }
  return runs;
}

TEST(EngineFrozen, FrozenHalfUntouchedAndTrainableHalfEqualsTheRunWithConstants) {
  const std::vector<Plan> runs = CasesAndNvme();
  for (const Plan& run : runs) {
    SCOPED_TRACE(Name(run));
    auto a = TrainAndCompareWithConstants(run);
    ASSERT_TRUE(a.ok()) << a.status();
  }
  fs::remove_all(runs.back().nvme);
}

// With the update in backward (stages 2-3), a frozen unit has no update to run there and is not a unit
// "without a backward": the frozen half stays untouched, and the trainable half equals both the fused run
// with constants and the unfused run (clipping off in all three), bit for bit.
TEST(EngineFrozen, TheUpdateInBackwardLeavesFrozenUnitsOut) {
  std::vector<Plan> runs;
  for (Plan r : Cases(/*first_stage=*/2)) {
    r.in_backward = true;
    r.clip = false;
    runs.push_back(r);
  }
  Plan nvme;
  nvme.world = 2;
  nvme.stage = 3;
  nvme.dtype = DType::kBF16;
  nvme.nvme = NvmeDir();
  nvme.in_backward = true;
  nvme.clip = false;
  runs.push_back(nvme);
  for (const Plan& run : runs) {
    SCOPED_TRACE(Name(run) + ", optimizer_in_backward");
    auto a = TrainAndCompareWithConstants(run);
    ASSERT_TRUE(a.ok()) << a.status();
    Plan unfused = run;
    unfused.in_backward = false;
    auto c = Train(unfused);
    ASSERT_TRUE(c.ok()) << c.status();
    for (int k = 0; k < kPairs; ++k) {
      EXPECT_EQ(0, std::memcmp(a->trained[k].data(), c->trained[k].data(), a->trained[k].size() * 4))
          << "adapter" << k << " differs from the unfused run";
    }
  }
  fs::remove_all(nvme.nvme);
}

uint64_t Tracked(const MemoryStats& m, memory::Kind k) {
  uint64_t bytes = 0;
  for (int t = 0; t < memory::kNumTiers; ++t) bytes += m.kind[t][static_cast<int>(k)].current_bytes;
  return bytes;
}

TEST(EngineFrozen, TheFrozenHalfCostsExactlyItsParameterBytes) {
  for (Plan run : Cases()) {
    SCOPED_TRACE(Name(run));
    run.steps = 1;
    auto a = Train(run);
    ASSERT_TRUE(a.ok()) << a.status();
    Plan constants = run;
    constants.with_frozen = false;
    auto b = Train(constants, a->seen);
    ASSERT_TRUE(b.ok()) << b.status();
    uint64_t frozen_bytes = 0;
    for (size_t bytes : a->frozen_param_bytes) frozen_bytes += bytes;
    uint64_t total_a = 0, total_b = 0;
    for (int t = 0; t < memory::kNumTiers; ++t) {
      total_a += a->memory.tier[t].current_bytes;
      total_b += b->memory.tier[t].current_bytes;
    }
    EXPECT_EQ(total_a - total_b, frozen_bytes);
    EXPECT_EQ(Tracked(a->memory, memory::Kind::kParamShard) - Tracked(b->memory, memory::Kind::kParamShard),
              frozen_bytes);
    for (memory::Kind k : {memory::Kind::kMaster, memory::Kind::kGradShard, memory::Kind::kOptimizerState,
                           memory::Kind::kGradWorking, memory::Kind::kGathered, memory::Kind::kScratch}) {
      EXPECT_EQ(Tracked(a->memory, k), Tracked(b->memory, k)) << memory::KindName(k);
    }
  }
}

class FrozenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/frozen_ckpt_" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(FrozenCheckpoint, SavesTheFrozenValuesAndRestoresThemAtAnotherWorldSizeAndStage) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string step = dir_ + "/" + std::string(DTypeName(dtype));
    Plan save;
    save.world = 2;
    save.stage = 3;
    save.dtype = dtype;
    save.steps = 2;
    save.save = step;
    auto saved = Train(save);
    ASSERT_TRUE(saved.ok()) << saved.status();
    // Format 2, frozen parameters marked, only their master kind: the shards verify and cover everything.
    auto man = checkpoint::ReadManifest(step);
    ASSERT_TRUE(man.ok()) << man.status();
    EXPECT_EQ(man->version, checkpoint::kFrozenManifestVersion);
    EXPECT_TRUE(man->units[0].params[0].frozen);
    EXPECT_FALSE(man->units[1].params[0].frozen);
    auto verified = checkpoint::VerifyCheckpoint(step, *man);
    ASSERT_TRUE(verified.ok()) << verified.status();
    // Export: the frozen parameter's consolidated value is its value.
    auto w = checkpoint::ReadMasterParam(step, *man, 0, 0);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(0, std::memcmp(w->data(), saved->frozen_after[0].data(), w->size() * 4));
    // Every other layout: the frozen and trained values come back bit for bit.
    for (int world : {1, 2}) {
      for (int stage = 0; stage <= 3; ++stage) {
        Plan load;
        load.world = world;
        load.stage = stage;
        load.dtype = dtype;
        load.steps = 0;
        load.load = step;
        load.seed = 99;
        auto loaded = Train(load);
        ASSERT_TRUE(loaded.ok()) << loaded.status();
        for (int k = 0; k < kPairs; ++k) {
          const size_t n = std::min(saved->frozen_after[k].size(), loaded->frozen_after[k].size());
          EXPECT_EQ(0, std::memcmp(saved->frozen_after[k].data(), loaded->frozen_after[k].data(), n * 4))
              << "frozen base" << k << " at stage " << stage << ", " << world << " rank(s)";
          const size_t m = std::min(saved->trained[k].size(), loaded->trained[k].size());
          EXPECT_EQ(0, std::memcmp(saved->trained[k].data(), loaded->trained[k].data(), m * 4))
              << "adapter" << k << " at stage " << stage << ", " << world << " rank(s)";
        }
      }
    }
  }
}

TEST_F(FrozenCheckpoint, ResumingContinuesBitForBit) {
  Plan whole;
  whole.world = 2;
  whole.stage = 2;
  whole.steps = 4;
  auto straight = Train(whole);
  ASSERT_TRUE(straight.ok()) << straight.status();
  Plan first = whole;
  first.steps = 2;
  first.save = dir_ + "/step2";
  ASSERT_TRUE(Train(first).ok());
  Plan second = whole;
  second.steps = 2;
  second.load = first.save;
  second.seed = 99;
  auto resumed = Train(second);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  for (int k = 0; k < kPairs; ++k) {
    EXPECT_EQ(0, std::memcmp(straight->trained[k].data(), resumed->trained[k].data(), straight->trained[k].size() * 4));
    EXPECT_EQ(0, std::memcmp(straight->frozen_after[k].data(), resumed->frozen_after[k].data(),
                             straight->frozen_after[k].size() * 4));
  }
}

// Note [Frozen units in a snapshot]: at stage 3 an asynchronous save holds the frozen half's params in place, or
// with parameter shards on NVMe their extents: its snapshot copies exactly the host bytes of the same model
// without the frozen half. Its files equal the synchronous save's byte for byte although, while the writers
// were held, a forward wrote base0's w in place and then SetParam changed it (SetParam waited for the writers,
// or the NVMe shard's write for the writer to read past it, then took effect). Stages 0-3, 1 and 2 ranks, fp32
// and bf16, optimizer offload none and cpu, and the NVMe tiers; at stages 0-2 (where the forward's view is the
// param storage itself, which it just wrote) the frozen half is copied.
TEST_F(FrozenCheckpoint, AnAsyncSaveHoldsTheFrozenHalfInPlaceAndEqualsTheSyncSave) {
  const std::vector<Plan> runs = CasesAndNvme();
  for (Plan run : runs) {
    SCOPED_TRACE(Name(run));
    run.steps = 2;
    run.save = dir_ + "/sync";
    run.async_save = dir_ + "/async";
    std::latch release(run.world);
    run.release = &release;
    checkpoint::SetBeforeAsyncWriteForTest([&] { release.wait(); });
    auto a = Train(run);
    checkpoint::SetBeforeAsyncWriteForTest(nullptr);
    ASSERT_TRUE(a.ok()) << a.status();
    const auto sync = testing::FilesUnder(run.save), async = testing::FilesUnder(run.async_save);
    ASSERT_FALSE(sync.empty());
    EXPECT_TRUE(sync == async) << "the asynchronous save differs from the synchronous one";
    ASSERT_EQ(a->base0_after_save.size(), a->frozen_after[0].size());
    for (size_t i = 0; i < a->base0_after_save.size(); ++i) {  // w, then b (untouched)
      ASSERT_EQ(a->base0_after_save[i], i < size_t{kFrozenElems} ? kSetDuringSave : a->frozen_after[0][i]) << i;
    }
    // The same trainable half without the frozen one: the host bytes copied are the same.
    Plan b = run;
    b.with_frozen = false;
    b.release = nullptr;
    b.save.clear();
    b.async_save = dir_ + "/plain";
    auto plain = Train(b, a->seen);
    ASSERT_TRUE(plain.ok()) << plain.status();
    if (run.stage == 3) {
      EXPECT_EQ(a->snapshot.host, plain->snapshot.host) << "the frozen half was copied";
      uint64_t frozen_bytes = 0, frozen_io_bytes = 0;
      for (size_t n : a->frozen_param_bytes) {
        frozen_bytes += n;
        frozen_io_bytes += offload::NvmeStore::IoBytes(n);
      }
      if (run.nvme.empty()) {
        EXPECT_GT(a->snapshot.in_place, 0u);
        EXPECT_LE(a->snapshot.in_place, frozen_bytes);
      } else {  // the shards' extents, held on NVMe beside the optimizer state's tiles
        EXPECT_EQ(a->snapshot.in_place, 0u);
        EXPECT_EQ(a->snapshot.nvme - plain->snapshot.nvme, frozen_io_bytes);
      }
    } else {
      EXPECT_GT(a->snapshot.host, plain->snapshot.host);
      EXPECT_EQ(a->snapshot.in_place, 0u);
    }
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  fs::remove_all(runs.back().nvme);
}

TEST_F(FrozenCheckpoint, ModelsWithoutFrozenParametersStillWriteFormat1) {
  Plan run;
  run.with_frozen = false;
  run.steps = 1;
  run.save = dir_ + "/plain";
  ASSERT_TRUE(Train(run, std::vector<std::vector<float>>(kPairs, std::vector<float>(kFrozenElems, 0.5f))).ok());
  auto man = checkpoint::ReadManifest(run.save);
  ASSERT_TRUE(man.ok()) << man.status();
  EXPECT_EQ(man->version, 1);
}

TEST_F(FrozenCheckpoint, AFrozenFlagThatDiffersFromTheCheckpointIsRefused) {
  Plan run;
  run.steps = 1;
  run.save = dir_ + "/frozen";
  ASSERT_TRUE(Train(run).ok());
  // The same units with the base trainable.
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(ConfigOf(run), c, dev));
    for (int k = 0; k < kPairs; ++k) {
      std::vector<ParamSpec> base = FrozenSpecs();
      for (ParamSpec& p : base) p.frozen = false;
      STRATA_RETURN_IF_ERROR(e->RegisterUnit(absl::StrCat("base", k), base).status());
      STRATA_RETURN_IF_ERROR(e->RegisterUnit(absl::StrCat("adapter", k), TrainSpecs()).status());
    }
    STRATA_RETURN_IF_ERROR(e->Finalize());
    return e->LoadCheckpoint(run.save).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("'base0.w' is trainable here but was saved frozen"));
}

TEST(EngineFrozen, AUnitMixingFrozenAndTrainableParametersIsRefused) {
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(EngineConfig{}, c, dev));
    std::vector<ParamSpec> mixed = TrainSpecs();
    mixed.push_back(ParamSpec{"lora_a", {4}, false, Init::Zeros(), true});
    return e->RegisterUnit("block0", mixed).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("unit 'block0' mixes frozen parameters (lora_a) and trainable ones (w, b)"));
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("register them as two units"));
}

}  // namespace
}  // namespace strata::engine
