// strata.optimizer_in_backward (Note [Optimizer in backward], runtime/engine/engine_step.cc): each unit's
// update runs in backward over its reduced shard, so no gradient shard is kept. Against the same run
// without the key: the same weights and the same gradient norm bit for bit (the same update over the
// same reduced gradient), at stages 2-3, one and two ranks, memory and NVMe optimizer state, fp32 and
// bf16 params; the gradient shards' bytes gone from the accounting, exactly; the combinations it does
// not support (clipping among them, docs/decisions/0018-step-in-backward.md) refused by name.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/mlp_runs.h"

namespace strata::engine {
namespace {

using ::testing::HasSubstr;
using memory::Kind;
using memory::Tier;

absl::StatusOr<testing::MlpRun> Train(const EngineConfig& cfg, int world, int steps = 4) {
  return testing::TrainMlp(cfg, world, mlp::MlpShape{}, steps);
}

uint64_t Current(const MemoryStats& m, Tier t, Kind k) {
  return m.kind[static_cast<int>(t)][static_cast<int>(k)].current_bytes;
}
uint64_t TierCurrent(const MemoryStats& m, Tier t) { return m.tier[static_cast<int>(t)].current_bytes; }

class OptimizerInBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/oib_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  enum class State { kDevice, kCpu, kNvme, kNvmeParams };
  EngineConfig Config(int stage, DType dtype, State state) const {
    EngineConfig c;
    c.stage = stage;
    c.param_dtype = dtype;
    c.bf16 = dtype == DType::kBF16;
    if (state == State::kCpu) c.offload_optimizer.device = OffloadDevice::kCpu;
    if (state == State::kNvme || state == State::kNvmeParams) {
      c.offload_optimizer.device = OffloadDevice::kNvme;
      c.offload_optimizer.nvme_path = dir_;
      c.offload_optimizer.pin_memory = false;
      c.nvme_tile_elems = 1024;  // several tiles per unit
    }
    if (state == State::kNvmeParams) {
      c.max_live_units = 1;
      c.offload_param.device = OffloadDevice::kNvme;
      c.offload_param.nvme_path = dir_;
      c.offload_param.pin_memory = false;
      c.offload_param.buffer_count = 3;
    }
    return c;
  }
  std::string dir_;
};

const char* StateName(int s) {
  static const char* names[] = {"device", "cpu", "nvme", "nvme+params"};
  return names[s];
}

TEST_F(OptimizerInBackward, SameWeightsAndNormBitForBitAndNoGradientShards) {
  struct Case {
    int stage;
    State state;
  };
  for (const Case& c : {Case{2, State::kDevice}, Case{3, State::kDevice}, Case{2, State::kCpu}, Case{3, State::kCpu},
                        Case{2, State::kNvme}, Case{3, State::kNvme}, Case{3, State::kNvmeParams}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int world : {1, 2}) {
        const std::string what = absl::StrCat("stage ", c.stage, " ", StateName(static_cast<int>(c.state)), " ",
                                              DTypeName(dtype), " world ", world);
        EngineConfig base = Config(c.stage, dtype, c.state);
        EngineConfig fused = base;
        fused.optimizer_in_backward = true;
        auto a = Train(base, world);
        ASSERT_TRUE(a.ok()) << what << ": " << a.status();
        auto b = Train(fused, world);
        ASSERT_TRUE(b.ok()) << what << ": " << b.status();
        EXPECT_EQ(a->params, b->params) << what;
        ASSERT_EQ(a->steps.size(), b->steps.size());
        for (size_t s = 0; s < a->steps.size(); ++s) {
          EXPECT_EQ(a->steps[s].grad_norm, b->steps[s].grad_norm) << what << " step " << s;
          EXPECT_GT(b->steps[s].grad_norm, 0) << what;
          EXPECT_EQ(a->steps[s].step, b->steps[s].step) << what;
          // Gradients were never on NVMe: the same state bytes move either way.
          EXPECT_EQ(a->steps[s].nvme_read_bytes, b->steps[s].nvme_read_bytes) << what;
          EXPECT_EQ(a->steps[s].nvme_write_bytes, b->steps[s].nvme_write_bytes) << what;
        }
        // The accounting: exactly the gradient shards' bytes (4 per element of the rank's shards) are
        // gone from the optimizer's tier, and nothing else moved.
        const Tier t = c.state == State::kDevice ? Tier::kDevice : Tier::kPinnedHost;
        const uint64_t grad_bytes = a->grad_shard_elems * 4;
        EXPECT_EQ(Current(a->mem, t, Kind::kGradShard), grad_bytes) << what;
        EXPECT_EQ(Current(b->mem, t, Kind::kGradShard), 0u) << what;
        EXPECT_EQ(b->mem.kind[static_cast<int>(t)][static_cast<int>(Kind::kGradShard)].peak_bytes, 0u) << what;
        EXPECT_EQ(TierCurrent(a->mem, t) - TierCurrent(b->mem, t), grad_bytes) << what;
      }
    }
  }
}

TEST_F(OptimizerInBackward, TheOptimizerTimeIsReported) {
  EngineConfig cfg = Config(3, DType::kF32, State::kCpu);
  cfg.optimizer_in_backward = true;
  auto r = Train(cfg, 2, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const StepResult& s : r->steps) EXPECT_GT(s.optimizer_ms, 0) << "the updates in backward count";
}

// Two units of 8 ones; one step in which unit 0's gradient is `g0` and unit 1's is 1 (unit 1 is used
// only when `backward1`). Returns Step()'s status and unit 0's and 1's parameters after it.
struct TwoUnits {
  absl::Status step;
  std::vector<float> p0, p1;
  absl::Status gather_before_step, set_before_step, gather_after_step;  // GatherUnit / SetParam around Step()
};
TwoUnits StepTwoUnits(float g0, bool backward1) {
  TwoUnits out;
  EngineConfig cfg;
  cfg.stage = 2;  // the params stay readable through Param() after a failed Step()
  cfg.optimizer_in_backward = true;
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, dev));
    for (const char* name : {"u0", "u1"}) {
      STRATA_RETURN_IF_ERROR(e->RegisterUnit(name, {shard::ParamSpec{"w", {8}, false, shard::Init::Ones()}}).status());
    }
    STRATA_RETURN_IF_ERROR(e->Finalize());
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    for (int u : {0, 1}) {
      if (u == 1 && !backward1) continue;
      STRATA_RETURN_IF_ERROR(e->BeginForward(u));
      STRATA_RETURN_IF_ERROR(e->EndForward(u));
    }
    for (int u : {1, 0}) {
      if (u == 1 && !backward1) continue;
      STRATA_RETURN_IF_ERROR(e->BeginBackward(u));
      for (int i = 0; i < 8; ++i) e->Grad(u, 0)[i] += u == 0 ? g0 : 1.0f;
      STRATA_RETURN_IF_ERROR(e->EndBackward(u));
    }
    STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    out.gather_before_step = e->GatherUnit(1).status();
    out.set_before_step = e->SetParam(0, 0, std::vector<float>(8, 2.0f));
    out.step = e->Step().status();
    out.gather_after_step = e->GatherUnit(0).status();
    for (int u : {0, 1}) {
      const float* p = static_cast<const float*>(e->Param(u, 0).data);
      (u == 0 ? out.p0 : out.p1).assign(p, p + 8);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  return out;
}

// A non-finite gradient cannot skip the step (unit 1 was updated before unit 0's gradient was known):
// Step() fails naming it, and the non-finite gradient was not applied.
TEST(OptimizerInBackwardSteps, ANonFiniteGradientFailsTheStepAndIsNotApplied) {
  TwoUnits r = StepTwoUnits(std::nanf(""), true);
  EXPECT_EQ(r.step.code(), absl::StatusCode::kDataLoss) << r.step;
  EXPECT_THAT(std::string(r.step.message()), HasSubstr("non-finite gradient norm"));
  EXPECT_THAT(r.p0, ::testing::Each(1.0f)) << "unit 0's NaN gradient was not applied";
  EXPECT_THAT(r.p1, ::testing::Each(::testing::Lt(1.0f))) << "unit 1 was updated in backward";
  TwoUnits fine = StepTwoUnits(1.0f, true);
  EXPECT_TRUE(fine.step.ok()) << fine.step;
  EXPECT_EQ(fine.p0, fine.p1);
}

// Between the last backward and Step() the last reduced unit (here u0) is not updated yet while u1 is:
// reading or writing the weights then is refused, naming it, and works again after Step().
TEST(OptimizerInBackwardSteps, WeightsAreNotReadOrWrittenWhileAnUpdateIsPending) {
  TwoUnits r = StepTwoUnits(1.0f, true);
  for (const absl::Status& s : {r.gather_before_step, r.set_before_step}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("unit 'u0' is not updated yet"));
  }
  EXPECT_THAT(std::string(r.set_before_step.message()), HasSubstr("SetParam between the last backward and Step()"));
  EXPECT_TRUE(r.step.ok()) << r.step;
  EXPECT_TRUE(r.gather_after_step.ok()) << r.gather_after_step;
  EXPECT_EQ(r.p0, r.p1) << "the refused SetParam wrote nothing";
}

// A unit without a backward in the step gets no update in backward; without the key it would be
// updated with a zero gradient, so the engine says so instead of silently differing.
TEST(OptimizerInBackwardSteps, EveryUnitNeedsABackward) {
  TwoUnits r = StepTwoUnits(1.0f, false);
  EXPECT_EQ(r.step.code(), absl::StatusCode::kFailedPrecondition) << r.step;
  EXPECT_THAT(std::string(r.step.message()), HasSubstr("unit 'u1' had no backward in this step"));
}

// The choice of 0018: clipping by the global norm is refused (the norm is known only after every unit
// has been updated), as are accumulation, fp16 loss scaling and stages 0-1, each naming its key; the
// engine refuses a programmatic config the same way.
TEST(OptimizerInBackwardConfig, UnsupportedCombinationsAreRefusedByName) {
  struct Case {
    const char* json;
    const char* names;
  };
  for (const Case& c : {
           Case{R"({"gradient_clipping": 1.0, "strata": {"optimizer_in_backward": true}})", "gradient_clipping is 1"},
           Case{R"({"gradient_accumulation_steps": 2, "strata": {"optimizer_in_backward": true}})",
                "gradient_accumulation_steps is 2"},
           Case{R"({"fp16": {"enabled": true}, "strata": {"optimizer_in_backward": true}})", "fp16.enabled is true"},
           Case{R"({"zero_optimization": {"stage": 1}, "strata": {"optimizer_in_backward": true}})",
                "zero_optimization.stage is 1"},
           Case{R"({"zero_optimization": {"stage": 0}, "strata": {"optimizer_in_backward": true}})",
                "zero_optimization.stage is 0"},
       }) {
    auto cfg = ParseConfig(c.json);
    ASSERT_FALSE(cfg.ok()) << c.json;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("'strata.optimizer_in_backward'")) << c.json;
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(c.names)) << c.json;
  }
  auto ok = ParseConfig(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                            "strata": {"optimizer_in_backward": true}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->optimizer_in_backward);
  EXPECT_FALSE(ParseConfig("{}")->optimizer_in_backward);
  auto typo = ParseConfig(R"({"strata": {"optimizer_in_backwards": true}})");
  EXPECT_THAT(std::string(typo.status().message()), HasSubstr("optimizer_in_backward"));

  EngineConfig clip;
  clip.stage = 3;
  clip.gradient_clipping = 1.0;
  clip.optimizer_in_backward = true;
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    return Engine::Create(clip, c, dev).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("gradient_clipping"));
}

}  // namespace
}  // namespace strata::engine
