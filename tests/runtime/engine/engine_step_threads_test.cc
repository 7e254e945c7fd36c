// strata.optimizer_threads (engine_step.cc): the host optimizer update on a pool gives the same weights
// bit for bit as on one thread, at every stage, with the state on the device tier (host memory on a host
// build), offloaded to the pinned-host tier, and tiled through NVMe; the pool can be replaced between
// steps; a bad count is refused. The MLP is sized so that every rank's update range spans several
// kernel tiles (kernels/cpu/optimizer_ops.h), so a pool really splits the work.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

constexpr int kWorld = 2;
const mlp::MlpShape kShape{256, 512, 4};  // 131584 + 262656 + 2052 params: several tiles per rank

struct Run {
  std::vector<float> params;
  int threads_used = 0;  // rank 0's Engine::optimizer_threads() during the steps
};

// Trains `steps` steps; with `switch_to` > 0 the pool is replaced by one of that many threads halfway.
absl::StatusOr<Run> Train(const EngineConfig& cfg, int steps = 4, int switch_to = 0) {
  Run out;
  std::mutex mu;
  auto results = testing::RunRanks(kWorld, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    STRATA_ASSIGN_OR_RETURN(mlp::Mlp mlp, mlp::Mlp::Register(*e, kShape));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    const int micro = 8 / kWorld;
    for (int s = 0; s < steps; ++s) {
      if (switch_to > 0 && s == steps / 2) STRATA_RETURN_IF_ERROR(e->SetOptimizerThreads(switch_to));
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, int64_t{s} * 8 + rank * micro, micro).status());
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      STRATA_RETURN_IF_ERROR(e->Step().status());
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> all, e->GatherAllParams());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.params = std::move(all);
      out.threads_used = e->optimizer_threads();
    }
    return absl::OkStatus();
  });
  for (const auto& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

// Index of the first element whose bits differ, or -1.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

class EngineStepThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/threads_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  EngineConfig Config(int stage, OffloadDevice offload, DType dtype, int threads) const {
    EngineConfig c;
    c.stage = stage;
    c.param_dtype = dtype;
    c.optimizer.weight_decay = 0.1;  // weights decay, biases do not: segments with both policies
    c.offload_optimizer.device = offload;
    c.offload_optimizer.pin_memory = false;
    if (offload == OffloadDevice::kNvme) {
      c.offload_optimizer.nvme_path = dir_;
      c.nvme_tile_elems = 3 * kernels::cpu::kOptimizerTileElems + 1000;  // kernel tiles cross NVMe tiles
    }
    c.optimizer_threads = threads;
    return c;
  }
  std::string dir_;
};

TEST_F(EngineStepThreads, AnyThreadCountGivesTheSameWeightsBitForBit) {
  // The MLP must give each rank several kernel tiles, else a pool would not split anything.
  ASSERT_GT((256 * 512 + 512) / kWorld, 2 * static_cast<int>(kernels::cpu::kOptimizerTileElems));
  for (OffloadDevice offload : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (int stage : {1, 2, 3}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        const std::string what =
            absl::StrCat("offload ", static_cast<int>(offload), " stage ", stage, " ", DTypeName(dtype));
        auto one = Train(Config(stage, offload, dtype, 1));
        ASSERT_TRUE(one.ok()) << what << ": " << one.status();
        EXPECT_EQ(one->threads_used, 1) << what;
        for (int threads : {4, 3}) {
          auto many = Train(Config(stage, offload, dtype, threads));
          ASSERT_TRUE(many.ok()) << what << ": " << many.status();
          EXPECT_EQ(many->threads_used, threads) << what;
          const int64_t at = FirstDifference(one->params, many->params);
          EXPECT_EQ(at, -1) << what << ", " << threads << " threads: first differing param element " << at << " of "
                            << one->params.size();
        }
      }
    }
  }
}

TEST_F(EngineStepThreads, ThePoolCanBeReplacedBetweenStepsWithoutChangingTheResult) {
  auto fixed = Train(Config(3, OffloadDevice::kCpu, DType::kF32, 1));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  auto switched = Train(Config(3, OffloadDevice::kCpu, DType::kF32, 1), 4, /*switch_to=*/4);
  ASSERT_TRUE(switched.ok()) << switched.status();
  EXPECT_EQ(switched->threads_used, 4);
  EXPECT_EQ(FirstDifference(fixed->params, switched->params), -1);
}

TEST_F(EngineStepThreads, TheDefaultIsTheCpusThisProcessMayUseAtMost64) {
  EngineConfig c;  // optimizer_threads 0
  const int allowed = static_cast<int>(kernels::cpu::AllowedCpus().size());
  EXPECT_EQ(OptimizerThreads(c), std::clamp(allowed, 1, kMaxDefaultOptimizerThreads));
  c.optimizer_threads = 7;
  EXPECT_EQ(OptimizerThreads(c), 7);
  auto run = Train(Config(2, OffloadDevice::kNone, DType::kF32, 0), 1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->threads_used, std::clamp(allowed, 1, kMaxDefaultOptimizerThreads));
}

TEST_F(EngineStepThreads, ABadCountIsRefused) {
  EngineConfig c = Config(1, OffloadDevice::kNone, DType::kF32, 1);
  c.optimizer_threads = -1;  // ParseConfig refuses it; a hand-built config reaches Create
  auto r = Train(c, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("optimizer threads must be >= 0"), std::string::npos)
      << r.status();
  c.optimizer_threads = kernels::cpu::ThreadPool::kMaxThreads + 1;
  r = Train(c, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("host optimizer threads must be in [1, 256]"), std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace strata::engine
