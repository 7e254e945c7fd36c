// The runtime's own accounting against the analytic memory of each stage (docs/design.md "Memory is a
// contract"): per-rank sharded state of mixed-precision Adam is 16 bytes per parameter over N at stage 3,
// and gathered bytes never exceed max_live_units x the largest unit.
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using memory::Kind;
using shard::Init;
using shard::ParamSpec;

constexpr int kUnits = 3;
constexpr int kWidth = 256;

// Registers kUnits linear layers and runs `steps` steps whose gradients are a constant.
absl::Status RunSteps(Engine& e, int steps) {
  for (int u = 0; u < kUnits; ++u) {
    STRATA_RETURN_IF_ERROR(e.RegisterUnit(absl::StrCat("layer", u),
                                          {ParamSpec{"w", {kWidth, kWidth}, true, Init::Normal(0.02f)},
                                           ParamSpec{"b", {kWidth}, false, Init::Zeros()}})
                               .status());
  }
  STRATA_RETURN_IF_ERROR(e.Finalize());
  for (int s = 0; s < steps; ++s) {
    STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
    for (int u = 0; u < kUnits; ++u) {
      STRATA_RETURN_IF_ERROR(e.BeginForward(u));
      STRATA_RETURN_IF_ERROR(e.EndForward(u));
    }
    for (int u = kUnits - 1; u >= 0; --u) {
      STRATA_RETURN_IF_ERROR(e.BeginBackward(u));
      for (int p = 0; p < 2; ++p) {
        float* g = e.Grad(u, p);
        for (size_t i = 0; i < e.layout(u).params[p].numel; ++i) g[i] += 1e-3f;
      }
      STRATA_RETURN_IF_ERROR(e.EndBackward(u));
    }
    STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
    STRATA_RETURN_IF_ERROR(e.Step().status());
  }
  return absl::OkStatus();
}

struct Expect {
  int stage;
  DType dtype;
  // Bytes per parameter of the state kinds: replicated (x P) and sharded (x P / N).
  double replicated;
  double sharded;
};

TEST(EngineMemory, ShardedStateMatchesAnalyticBytes) {
  const int world = 4;
  const double P = kUnits * (double(kWidth) * kWidth + kWidth);
  // fp32 params: the param storage is the master (no separate copy).
  const Expect cases[] = {
      {3, DType::kF32, 0, 16},   // param 4 + grad 4 + Adam m, v 8, all sharded
      {3, DType::kBF16, 0, 18},  // bf16 param 2 + fp32 master 4 + grad 4 + m, v 8
      {2, DType::kF32, 4, 12},   // replicated params; grad, m, v sharded
      {1, DType::kF32, 8, 8},    // replicated params and grads; m, v sharded
      {0, DType::kF32, 16, 0},   // everything replicated
  };
  for (const Expect& c : cases) {
    EngineConfig cfg;
    cfg.stage = c.stage;
    cfg.param_dtype = c.dtype;
    cfg.max_live_units = 2;
    auto results = testing::RunRanks(world, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
      device::HostDevice dev;
      STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
      STRATA_RETURN_IF_ERROR(RunSteps(*e, 2));
      const MemoryStats m = e->memory_stats();
      auto peak = [&](Kind k) { return double(m.kind[0][static_cast<int>(k)].peak_bytes); };
      const double state = peak(Kind::kParamShard) + peak(Kind::kGradShard) + peak(Kind::kMaster) +
                           peak(Kind::kOptimizerState);
      const double analytic = c.replicated * P + c.sharded * P / world;
      EXPECT_NEAR(state / analytic, 1.0, 0.01) << "stage " << c.stage << " " << DTypeName(c.dtype) << " rank " << rank
                                                << ": state " << state << " bytes, analytic " << analytic;
      size_t largest = 0;
      for (int u = 0; u < e->num_units(); ++u) largest = std::max(largest, e->layout(u).total_elems);
      const double gathered = peak(Kind::kGathered);
      EXPECT_LE(gathered, double(cfg.max_live_units * largest * DTypeBytes(c.dtype))) << "stage " << c.stage;
      if (c.stage == 3) {
        EXPECT_GT(gathered, 0) << "stage 3 must gather into the pool";
      } else {
        EXPECT_EQ(gathered, 0) << "stages 0-2 keep parameters replicated";
      }
      // The device tier peak covers every kind; nothing is held outside the accounting.
      EXPECT_GE(double(m.tier[0].peak_bytes), state + gathered);
      return absl::OkStatus();
    });
    for (int r = 0; r < world; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
  }
}

// Note [Slot sizing]: a root unit 8x a block, open from the first forward to the end of the backward as
// strata.torch's root is. With 2 live units the pools are the root's own slot and 2 block slots (3 x 1
// block would not do: the root and one block are live together), not 2 slots of the root: exactly these
// bytes are allocated, and the budget check asks for exactly them.
TEST(EngineMemory, AnOutsizedRootIsHeldOnceBesideTheBlockSlots) {
  constexpr int kBlocks = 3;
  constexpr size_t kBlock = size_t{kWidth} * kWidth + kWidth, kRoot = 8 * size_t{kWidth} * kWidth;
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.max_live_units = 2;
  auto train = [&](Engine& e) -> absl::Status {
    STRATA_RETURN_IF_ERROR(
        e.RegisterUnit("root", {ParamSpec{"wte", {8 * kWidth, kWidth}, true, Init::Normal(0.02f)}}).status());
    for (int u = 0; u < kBlocks; ++u) {
      STRATA_RETURN_IF_ERROR(e.RegisterUnit(absl::StrCat("block", u),
                                            {ParamSpec{"w", {kWidth, kWidth}, true, Init::Normal(0.02f)},
                                             ParamSpec{"b", {kWidth}, false, Init::Zeros()}})
                                 .status());
    }
    STRATA_RETURN_IF_ERROR(e.Finalize());
    for (int s = 0; s < 2; ++s) {
      STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
      STRATA_RETURN_IF_ERROR(e.BeginForward(0));
      for (int u = 1; u <= kBlocks; ++u) {
        STRATA_RETURN_IF_ERROR(e.BeginForward(u));
        STRATA_RETURN_IF_ERROR(e.EndForward(u));
      }
      STRATA_RETURN_IF_ERROR(e.EndForward(0));
      STRATA_RETURN_IF_ERROR(e.BeginBackward(0));
      for (int u = kBlocks; u >= 0; --u) {
        if (u > 0) STRATA_RETURN_IF_ERROR(e.BeginBackward(u));
        for (size_t p = 0; p < e.layout(u).params.size(); ++p) {
          float* g = e.Grad(u, static_cast<int>(p));
          for (size_t i = 0; i < e.layout(u).params[p].numel; ++i) g[i] += 1e-3f;
        }
        STRATA_RETURN_IF_ERROR(e.EndBackward(u));
      }
      STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
      STRATA_RETURN_IF_ERROR(e.Step().status());
    }
    return absl::OkStatus();
  };
  std::atomic<uint64_t> device_peak{0};
  auto run = [&](uint64_t budget) {
    cfg.device_budget_bytes = budget;
    return testing::RunRanks(2, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
      device::HostDevice dev;
      STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
      STRATA_RETURN_IF_ERROR(train(*e));
      const MemoryStats m = e->memory_stats();
      auto peak = [&](Kind k) { return m.kind[0][static_cast<int>(k)].peak_bytes; };
      EXPECT_EQ(peak(Kind::kGathered), (kRoot + 2 * kBlock) * 4) << "was 2 x the root: " << 2 * kRoot * 4;
      EXPECT_EQ(peak(Kind::kGradWorking), (kRoot + 2 * kBlock) * 4);
      if (rank == 0) device_peak = m.tier[0].peak_bytes;
      return absl::OkStatus();
    });
  };
  for (const absl::Status& s : run(memory::kUnlimited)) EXPECT_TRUE(s.ok()) << s;
  // The budget check asks for what Finalize allocates: that many bytes fit, one fewer does not.
  const uint64_t need = device_peak;
  for (const absl::Status& s : run(need)) EXPECT_TRUE(s.ok()) << s;
  for (const absl::Status& s : run(need - 1)) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("(1 bytes); offload"), absl::string_view::npos) << s;
  }
}

TEST(EngineMemory, DeviceBudgetTooSmallFailsNamingTheTier) {
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.device_budget_bytes = 100000;  // far below 16 bytes x 200k params / 2
  auto results = testing::RunRanks(2, comm::Options{}, [&](int, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
    return RunSteps(*e, 1);
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("tier 'device'"), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace strata::engine
