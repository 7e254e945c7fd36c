// strata.release_idle_memory (Note [Idle pages], runtime/memory/memory.cc): idle pool slots and gradient
// shards between a step and the next reduction hand their pages back to the OS. Against the same run
// without the key: the same weights and gradient norms bit for bit and the same accounting, at stages 0-3,
// one and two ranks, with accumulation, clipping, bf16 params and CPU or NVMe optimizer state; and the
// pages themselves: after a step the gradient (stages 0-1: the full gradient; 2-3: the working buffer)
// holds no page with the key, and every page without it.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/mlp_runs.h"

namespace strata::engine {
namespace {

// Three steps of the MLP at hidden 512, so that its units span whole pages.
absl::StatusOr<testing::MlpRun> Train(const EngineConfig& cfg, int world) {
  return testing::TrainMlp(cfg, world, mlp::MlpShape{16, 512, 4}, 3);
}

class IdlePages : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/idle_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(IdlePages, SameWeightsNormsAndAccountingBitForBit) {
  struct Case {
    int stage, accum;
    double clip;
    DType dtype;
    OffloadDevice optimizer;
    bool in_backward = false;  // strata.optimizer_in_backward: no gradient shards, the scratch holds the shard
  };
  const Case cases[] = {
      {0, 1, 0, DType::kF32, OffloadDevice::kNone}, {1, 2, 0, DType::kF32, OffloadDevice::kNone},
      {2, 1, 0, DType::kF32, OffloadDevice::kNone}, {2, 2, 0.5, DType::kBF16, OffloadDevice::kCpu},
      {3, 1, 0, DType::kF32, OffloadDevice::kNone}, {3, 2, 0.5, DType::kF32, OffloadDevice::kNone},
      {3, 2, 0, DType::kBF16, OffloadDevice::kCpu}, {3, 1, 0, DType::kF32, OffloadDevice::kNvme},
      {2, 1, 0, DType::kF32, OffloadDevice::kNone, true}, {3, 1, 0, DType::kF32, OffloadDevice::kNone, true},
  };
  for (const Case& c : cases) {
    for (int world : {1, 2}) {
      const std::string what = absl::StrCat("stage ", c.stage, " accum ", c.accum, " clip ", c.clip, " ",
                                            DTypeName(c.dtype), " optimizer ", static_cast<int>(c.optimizer),
                                            c.in_backward ? " in backward" : "", " world ", world);
      EngineConfig base;
      base.stage = c.stage;
      base.gradient_accumulation_steps = c.accum;
      base.gradient_clipping = c.clip;
      base.param_dtype = c.dtype;
      base.bf16 = c.dtype == DType::kBF16;
      base.max_live_units = 2;
      base.optimizer_in_backward = c.in_backward;
      base.offload_optimizer.device = c.optimizer;
      if (c.optimizer == OffloadDevice::kNvme) {
        base.offload_optimizer.nvme_path = dir_;
        base.offload_optimizer.pin_memory = false;
        base.nvme_tile_elems = 4096;
      }
      EngineConfig idle = base;
      idle.release_idle_memory = true;
      auto a = Train(base, world);
      ASSERT_TRUE(a.ok()) << what << ": " << a.status();
      auto b = Train(idle, world);
      ASSERT_TRUE(b.ok()) << what << ": " << b.status();
      EXPECT_EQ(a->params, b->params) << what;
      ASSERT_EQ(a->steps.size(), b->steps.size());
      for (size_t s = 0; s < a->steps.size(); ++s) {
        EXPECT_EQ(a->steps[s].grad_norm, b->steps[s].grad_norm) << what << " step " << s;
        EXPECT_GT(b->steps[s].grad_norm, 0) << what;
      }
      // The bytes stay reserved and counted: the accounting does not move.
      for (int t = 0; t < memory::kNumTiers; ++t) {
        EXPECT_EQ(a->mem.tier[t].peak_bytes, b->mem.tier[t].peak_bytes) << what << " tier " << t;
        EXPECT_EQ(a->mem.tier[t].current_bytes, b->mem.tier[t].current_bytes) << what << " tier " << t;
      }
    }
  }
}

// One unit of one 512 x 512 weight (1 MiB); the trainer writes its gradient by hand.
struct Pages {
  memory::Residency grad;  // after the step
};

absl::StatusOr<Pages> OneStep(int stage, int world, bool release) {
  EngineConfig cfg;
  cfg.stage = stage;
  cfg.release_idle_memory = release;
  Pages out;
  std::mutex mu;
  auto results = testing::RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    STRATA_RETURN_IF_ERROR(
        e->RegisterUnit("w", {shard::ParamSpec{"w", {512, 512}, true, shard::Init::Normal(0.02f)}}).status());
    STRATA_RETURN_IF_ERROR(e->Finalize());
    constexpr size_t kElems = 512 * 512;
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(e->BeginForward(0));
    STRATA_RETURN_IF_ERROR(e->EndForward(0));
    STRATA_RETURN_IF_ERROR(e->BeginBackward(0));
    float* g = e->Grad(0, 0);
    if (g == nullptr) return absl::InternalError("no gradient buffer in backward");
    std::fill(g, g + kElems, 1.0f);
    STRATA_RETURN_IF_ERROR(e->EndBackward(0));
    STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    STRATA_RETURN_IF_ERROR(e->Step().status());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.grad = memory::ResidentBytes(g, kElems * 4);
    }
    return absl::OkStatus();
  });
  for (const auto& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

TEST(IdlePagesResidency, AfterAStepTheGradientBuffersHoldNoPage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 2}) {
      const std::string what = absl::StrCat("stage ", stage, " world ", world);
      auto kept = OneStep(stage, world, false);
      ASSERT_TRUE(kept.ok()) << what << ": " << kept.status();
      auto given = OneStep(stage, world, true);
      ASSERT_TRUE(given.ok()) << what << ": " << given.status();
      ASSERT_GT(kept->grad.whole, size_t{900} << 10) << what;
      EXPECT_EQ(kept->grad.resident, kept->grad.whole) << what << ": without the key the gradient keeps its pages";
      EXPECT_EQ(given->grad.resident, 0u) << what << ": the gradient buffer was not handed back";
    }
  }
}

}  // namespace
}  // namespace strata::engine
