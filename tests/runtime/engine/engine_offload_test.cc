// Host-tier offload (offload_param / offload_optimizer = cpu): the same weights bit for bit as without
// offload (the arithmetic is the same), state placed on the tier the config names, budgets honoured and
// a run that cannot fit refused before training, naming the tier and the shortfall.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using ::testing::HasSubstr;
using memory::Kind;
using memory::Tier;

// Note [Staged gathers]: a communicator that claims device_buffers(), as NCCL does, so that the engine
// stages host parameter shards through the gathered buffer; it counts the gathers on 'gather' and how
// many of them ran in place (send is the rank's own block of recv), and forwards everything.
struct StagingProbe {
  std::atomic<int> gathers{0}, in_place{0};
};

class DeviceBuffersComm final : public comm::Communicator {
 public:
  DeviceBuffersComm(comm::Communicator* inner, std::unique_ptr<comm::Communicator> owned, StagingProbe* probe)
      : inner_(inner), owned_(std::move(owned)), probe_(probe) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const comm::Options& options() const override { return inner_->options(); }
  bool device_buffers() const override { return true; }
  comm::Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& stream) override {
    if (options().name == "gather") {
      ++probe_->gathers;
      if (send == static_cast<char*>(recv) + static_cast<size_t>(rank()) * count * DTypeBytes(dtype)) {
        ++probe_->in_place;
      }
    }
    return inner_->AllGather(send, recv, count, dtype, stream);
  }
  comm::Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, comm::ReduceOp op,
                           device::Stream& stream) override {
    return inner_->ReduceScatter(send, recv, count, dtype, op, stream);
  }
  comm::Work AllReduce(const void* send, void* recv, size_t count, DType dtype, comm::ReduceOp op,
                       device::Stream& stream) override {
    return inner_->AllReduce(send, recv, count, dtype, op, stream);
  }
  comm::Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& stream) override {
    return inner_->Broadcast(buf, count, dtype, root, stream);
  }
  comm::Work Barrier(device::Stream& stream) override { return inner_->Barrier(stream); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> d, inner_->Dup(name, timeout_ms));
    comm::Communicator* raw = d.get();
    return std::unique_ptr<comm::Communicator>(new DeviceBuffersComm(raw, std::move(d), probe_));
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key, const std::string& name,
                                                            int64_t timeout_ms) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> d, inner_->Split(color, key, name, timeout_ms));
    comm::Communicator* raw = d.get();
    return std::unique_ptr<comm::Communicator>(new DeviceBuffersComm(raw, std::move(d), probe_));
  }
  comm::Traffic traffic() const override { return inner_->traffic(); }
  void Abort(const absl::Status& cause) override { inner_->Abort(cause); }

 private:
  comm::Communicator* inner_;
  std::unique_ptr<comm::Communicator> owned_;
  StagingProbe* probe_;
};

struct Outcome {
  std::vector<float> params;
  MemoryStats mem;
  std::vector<StepResult> steps;  // rank 0's
};

// With `probe`, each rank's world is a DeviceBuffersComm reporting to it.
absl::StatusOr<Outcome> TrainMlp(EngineConfig cfg, int world, int steps = 6, const std::string& load = "",
                                 const std::string& save = "", StagingProbe* probe = nullptr) {
  Outcome out;
  std::mutex mu;
  auto results =
      testing::RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& world_comm) -> absl::Status {
        DeviceBuffersComm staged(&world_comm, nullptr, probe);
        comm::Communicator& c = probe != nullptr ? static_cast<comm::Communicator&>(staged) : world_comm;
        device::HostDevice dev;
        STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
        STRATA_ASSIGN_OR_RETURN(mlp::Mlp mlp, mlp::Mlp::Register(*e, mlp::MlpShape{}));
        STRATA_RETURN_IF_ERROR(e->Finalize());
        if (!load.empty()) STRATA_RETURN_IF_ERROR(e->LoadCheckpoint(load).status());
        const int micro = 8 / world;
        std::vector<StepResult> results;
        for (int s = 0; s < steps; ++s) {
          STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
          STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, int64_t{s} * 8 + rank * micro, micro).status());
          STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
          STRATA_ASSIGN_OR_RETURN(StepResult r, e->Step());
          results.push_back(r);
        }
        if (!save.empty()) STRATA_RETURN_IF_ERROR(e->SaveCheckpoint(save, "{}"));
        STRATA_ASSIGN_OR_RETURN(std::vector<float> all, e->GatherAllParams());
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          out.params = std::move(all);
          out.mem = e->memory_stats();
          out.steps = std::move(results);
        }
        return absl::OkStatus();
      });
  for (const auto& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

uint64_t Peak(const MemoryStats& m, Tier t, Kind k) {
  return m.kind[static_cast<int>(t)][static_cast<int>(k)].peak_bytes;
}

TEST(EngineOffload, CpuOffloadGivesTheSameWeightsBitForBit) {
  struct Case {
    int stage;
    bool params, optimizer;
    DType dtype;
  };
  for (const Case& c : {Case{3, true, true, DType::kF32}, Case{3, false, true, DType::kF32},
                        Case{3, true, false, DType::kF32}, Case{2, false, true, DType::kF32},
                        Case{1, false, true, DType::kF32}, Case{3, true, true, DType::kBF16}}) {
    EngineConfig base;
    base.stage = c.stage;
    base.param_dtype = c.dtype;
    EngineConfig off = base;
    if (c.params) off.offload_param.device = OffloadDevice::kCpu;
    if (c.optimizer) off.offload_optimizer.device = OffloadDevice::kCpu;
    for (int world : {2, 4}) {
      auto a = TrainMlp(base, world), b = TrainMlp(off, world);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      EXPECT_EQ(a->params, b->params) << "stage " << c.stage << " params " << c.params << " optimizer "
                                      << c.optimizer << " world " << world;
    }
  }
}

TEST(EngineOffload, StateLivesOnTheTierTheConfigNames) {
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.offload_optimizer.device = OffloadDevice::kCpu;
  auto r = TrainMlp(cfg, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  const MemoryStats& m = r->mem;
  EXPECT_GT(Peak(m, Tier::kDevice, Kind::kParamShard), 0u);
  EXPECT_EQ(Peak(m, Tier::kPinnedHost, Kind::kParamShard), 0u);
  for (Kind k : {Kind::kMaster, Kind::kGradShard, Kind::kOptimizerState}) {
    EXPECT_GT(Peak(m, Tier::kPinnedHost, k), 0u) << memory::KindName(k);
    EXPECT_EQ(Peak(m, Tier::kDevice, k), 0u) << memory::KindName(k);
  }
  cfg.offload_param.device = OffloadDevice::kCpu;
  auto p = TrainMlp(cfg, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_GT(Peak(p->mem, Tier::kPinnedHost, Kind::kParamShard), 0u);
  EXPECT_EQ(Peak(p->mem, Tier::kDevice, Kind::kParamShard), 0u);
  EXPECT_GT(Peak(p->mem, Tier::kDevice, Kind::kGathered), 0u) << "gathered units stay on the device";
}

TEST(EngineOffload, TooSmallADeviceBudgetSpillsWithOffloadAndIsRefusedWithout) {
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.device_budget_bytes = 48 * 1024;  // the MLP's sharded fp32 Adam state alone needs more at 2 ranks
  auto refused = TrainMlp(cfg, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("tier 'device' needs"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("short by"));
  cfg.offload_optimizer.device = OffloadDevice::kCpu;
  cfg.offload_param.device = OffloadDevice::kCpu;
  auto spilled = TrainMlp(cfg, 2);
  ASSERT_TRUE(spilled.ok()) << spilled.status();
  EXPECT_LE(spilled->mem.tier[static_cast<int>(Tier::kDevice)].peak_bytes, cfg.device_budget_bytes);
  cfg.host_budget_bytes = 1024;
  auto host_short = TrainMlp(cfg, 2);
  EXPECT_THAT(std::string(host_short.status().message()), HasSubstr("tier 'pinned_host' needs"));
}

class NvmeOffload : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/nvme_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  EngineConfig Nvme(int stage) const {
    EngineConfig c;
    c.stage = stage;
    c.offload_optimizer.device = OffloadDevice::kNvme;
    c.offload_optimizer.nvme_path = dir_;
    c.offload_optimizer.pin_memory = false;
    c.nvme_tile_elems = 1024;  // several tiles per unit: the pipeline overlaps them
    return c;
  }
  // Stage 3 with one live gathered unit and no offload: what the parameter offload tests compare with.
  static EngineConfig Stage3(DType dtype) {
    EngineConfig c;
    c.stage = 3;
    c.param_dtype = dtype;
    c.max_live_units = 1;
    return c;
  }
  // Stage 3, one live gathered unit, parameter shards on NVMe with `buffers` (at least 2) cache buffers.
  EngineConfig NvmeParams(int buffers) const {
    EngineConfig c;
    c.stage = 3;
    c.max_live_units = 1;
    c.offload_param.device = OffloadDevice::kNvme;
    c.offload_param.nvme_path = dir_;
    c.offload_param.pin_memory = false;
    c.offload_param.buffer_count = buffers;
    return c;
  }
  std::string dir_;
};

TEST_F(NvmeOffload, OptimizerStateOnNvmeGivesTheSameWeightsBitForBit) {
  for (int stage : {1, 2, 3}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      EngineConfig base;
      base.stage = stage;
      base.param_dtype = dtype;
      EngineConfig nvme = Nvme(stage);
      nvme.param_dtype = dtype;
      auto a = TrainMlp(base, 2), b = TrainMlp(nvme, 2);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->params, b->params) << "stage " << stage << " " << DTypeName(dtype);
      const MemoryStats& m = b->mem;
      EXPECT_GT(Peak(m, Tier::kNvme, Kind::kMaster), 0u);
      EXPECT_GT(Peak(m, Tier::kNvme, Kind::kOptimizerState), 0u);
      EXPECT_EQ(Peak(m, Tier::kDevice, Kind::kOptimizerState) + Peak(m, Tier::kPinnedHost, Kind::kOptimizerState), 0u);
    }
  }
}

TEST_F(NvmeOffload, CheckpointsStreamNvmeStateAndLoadAnywhere) {
  const std::string ck = dir_ + "/ckpt";
  auto saved = TrainMlp(Nvme(3), 2, 3, "", ck);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EngineConfig plain;
  plain.stage = 1;
  auto loaded = TrainMlp(plain, 1, 0, ck);  // no offload, another world size and stage
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->params, saved->params);
  // Continuing with NVMe state after loading matches continuing without offload, bit for bit.
  EngineConfig stage3;
  stage3.stage = 3;
  auto a = TrainMlp(Nvme(3), 2, 3, ck), b = TrainMlp(stage3, 2, 3, ck);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->params, b->params);
}

// Note [NVMe params]: parameter shards on NVMe behind a write-through cache of pinned buffers.
TEST_F(NvmeOffload, ParamsOnNvmeGiveTheSameWeightsBitForBit) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const EngineConfig base = Stage3(dtype);
    for (int world : {2, 4}) {
      auto a = TrainMlp(base, world);
      ASSERT_TRUE(a.ok()) << a.status();
      for (OffloadDevice optimizer : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
        for (int buffers : {1, 8}) {  // 2 buffers (1 live + 1): evicted and re-read each use; 8: all cached
          EngineConfig nvme = NvmeParams(buffers);
          nvme.param_dtype = dtype;
          nvme.offload_optimizer = Nvme(3).offload_optimizer;
          nvme.offload_optimizer.device = optimizer;
          nvme.nvme_tile_elems = 1024;
          auto b = TrainMlp(nvme, world);
          ASSERT_TRUE(b.ok()) << b.status();
          const std::string what = absl::StrCat(DTypeName(dtype), " optimizer ", static_cast<int>(optimizer),
                                                " buffers ", buffers, " world ", world);
          EXPECT_EQ(a->params, b->params) << what;
          EXPECT_GT(Peak(b->mem, Tier::kNvme, Kind::kParamShard), 0u) << what;
          EXPECT_EQ(Peak(b->mem, Tier::kDevice, Kind::kParamShard), 0u) << what;
        }
      }
    }
  }
}

// Note [Staged gathers]: host shards (cpu or NVMe) reach a communicator that takes only device buffers
// through the rank's block of the gathered buffer, copied on the copy stream; the result is unchanged.
TEST_F(NvmeOffload, HostShardsAreStagedForADeviceBufferCommunicator) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const EngineConfig base = Stage3(dtype);
    for (int world : {2, 4}) {
      StagingProbe unstaged;
      auto a = TrainMlp(base, world, 6, "", "", &unstaged);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_GT(unstaged.gathers.load(), 0);
      EXPECT_EQ(unstaged.in_place.load(), 0) << "device shards are sent from where they live";
      for (OffloadDevice params : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
        EngineConfig off = params == OffloadDevice::kNvme ? NvmeParams(1) : base;
        off.offload_param.device = params;
        off.offload_optimizer.device = OffloadDevice::kCpu;
        off.param_dtype = dtype;
        const std::string what =
            absl::StrCat("params ", static_cast<int>(params), " ", DTypeName(dtype), " world ", world);
        StagingProbe staged;
        auto b = TrainMlp(off, world, 6, "", "", &staged);
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_EQ(a->params, b->params) << what;
        EXPECT_GT(staged.gathers.load(), 0) << what;
        EXPECT_EQ(staged.in_place.load(), staged.gathers.load()) << what << ": every host shard was staged";
      }
    }
  }
}

TEST_F(NvmeOffload, ParamShardsAreReadAgainOnlyWhenTheCacheIsTooSmall) {
  EngineConfig c = NvmeParams(8);  // every shard fits: written through, never read back
  auto big = TrainMlp(c, 2, 3);
  ASSERT_TRUE(big.ok()) << big.status();
  const uint64_t shards = Peak(big->mem, Tier::kNvme, Kind::kParamShard);  // 4 KiB-rounded
  for (const StepResult& r : big->steps) {
    EXPECT_EQ(r.nvme_read_bytes, 0u) << "step " << r.step;
    EXPECT_GT(r.nvme_write_bytes, 0u);
    EXPECT_LE(r.nvme_write_bytes, shards);
  }
  // 2 buffers for 3 units: the forward and the backward each need a shard the cache cannot hold, so every
  // step reads. How much more it reads depends on when the gather stream releases its leases (read-ahead
  // takes a buffer only when one is free), so only the lower bound is asserted.
  c.offload_param.buffer_count = 1;
  auto small = TrainMlp(c, 2, 3);
  ASSERT_TRUE(small.ok()) << small.status();
  for (size_t s = 1; s < small->steps.size(); ++s) {
    EXPECT_GT(small->steps[s].nvme_read_bytes, 0u) << "step " << s;
  }
  EXPECT_EQ(small->params, big->params);
}

TEST_F(NvmeOffload, ACorruptParameterShardIsDataLossNamingTheUnit) {
  const EngineConfig c = NvmeParams(1);
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(c, comm, dev));
    STRATA_ASSIGN_OR_RETURN(mlp::Mlp mlp, mlp::Mlp::Register(*e, mlp::MlpShape{}));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    // Written through at Finalize; with 2 buffers the first unit is no longer cached. Flip every byte on disk.
    // The swap files have no names (Note [Swap files leave nothing behind]): find the parameter store's
    // among this process's descriptors, whose links still show the name they had.
    const std::string dir = std::filesystem::canonical(dir_).string() + "/";
    for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (ec || target.rfind(dir, 0) != 0 || target.find("params") == std::string::npos) continue;
      std::FILE* fp = std::fopen(fd.path().c_str(), "r+b");
      std::vector<char> bytes(std::filesystem::file_size(fd.path()));
      EXPECT_EQ(std::fread(bytes.data(), 1, bytes.size(), fp), bytes.size());
      for (char& b : bytes) b = static_cast<char>(~b);
      std::rewind(fp);
      std::fwrite(bytes.data(), 1, bytes.size(), fp);
      std::fclose(fp);
    }
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    return mlp.TrainMicroBatch(*e, 0, 4).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDataLoss) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("reading the parameter shard of unit 'input'"));
}

TEST_F(NvmeOffload, MissingPathIsANamedError) {
  EngineConfig c = Nvme(3);
  c.offload_optimizer.nvme_path = dir_ + "/does/not/exist";
  auto r = TrainMlp(c, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does/not/exist"));
  c = Nvme(3);
  c.offload_param.device = OffloadDevice::kNvme;
  c.offload_param.nvme_path = dir_ + "/params/not/here";
  r = TrainMlp(c, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("offload_param.nvme_path '" + dir_ + "/params/not/here'"));
}

}  // namespace
}  // namespace strata::engine
