// Note [Parameters without a gradient] (runtime/engine/engine_step.cc): with strata.params_without_grad
// "skip", a parameter that no rank marked as having a gradient is left out of the step (its value unchanged
// bit for bit, though weight decay and its moments would move it), a parameter one rank wrote a gradient
// to is updated, a unit without a backward use is left out, and the next update of a parameter that skipped
// steps uses its own step count (the same bits at every stage and world size). With "zero" (the default) the
// marks change nothing. Stages 0-3, 1 and 2 ranks.
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using shard::Init;
using shard::ParamSpec;

EngineConfig Config(int stage, bool skip) {
  EngineConfig c;
  c.stage = stage;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.skip_params_without_grad = skip;
  return c;
}

// Units "a" (w[4,3] decayed, b[3]) and "c" (w[5] decayed). Each step uses both units; `marked(step, rank)`
// says whether that rank marks a.w as without a gradient (its gradient then stays zero on that rank).
// Returns every parameter's value after `steps` steps, on rank 0.
struct Plan {
  int world = 1, stage = 0, steps = 4;
  bool skip = true;
  bool use_c = true;  // false: unit c has no backward use in any step
  std::function<bool(int step, int rank)> marked = [](int, int) { return false; };
};

absl::StatusOr<std::vector<std::vector<float>>> Train(const Plan& run) {
  std::vector<std::vector<float>> out;
  auto results = testing::RunRanks(run.world, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Config(run.stage, run.skip), comm, dev));
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("a", {ParamSpec{"w", {4, 3}, true, Init::Normal(0.5f)},
                                                 ParamSpec{"b", {3}, false, Init::Uniform(0.3f)}})
                               .status());
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("c", {ParamSpec{"w", {5}, true, Init::Normal(0.5f)}}).status());
    STRATA_RETURN_IF_ERROR(e->Finalize());
    std::vector<int> order = run.use_c ? std::vector<int>{0, 1} : std::vector<int>{0};
    for (int step = 0; step < run.steps; ++step) {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      for (int u : order) {
        STRATA_RETURN_IF_ERROR(e->BeginForward(u));
        STRATA_RETURN_IF_ERROR(e->EndForward(u));
      }
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        STRATA_RETURN_IF_ERROR(e->BeginBackward(*it));
        for (int p = 0; p < static_cast<int>(e->layout(*it).params.size()); ++p) {
          if (*it == 0 && p == 0 && run.marked(step, rank)) {
            STRATA_RETURN_IF_ERROR(e->MarkNoGrad(0, 0));
            STRATA_RETURN_IF_ERROR(e->MarkNoGrad(0, 0));  // idempotent within the micro-batch
            continue;
          }
          float* g = e->Grad(*it, p);
          for (size_t i = 0; i < e->layout(*it).params[p].numel; ++i) g[i] += 0.01f * (1 + i % 3) * (1 + rank + step);
        }
        STRATA_RETURN_IF_ERROR(e->EndBackward(*it));
      }
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      STRATA_RETURN_IF_ERROR(e->Step().status());
    }
    for (auto [u, p] : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}}) {
      STRATA_ASSIGN_OR_RETURN(std::vector<float> v, e->GatherParam(u, p));
      if (rank == 0) out.push_back(v);
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

class NoGrad : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(NoGrad, AParameterNoRankWroteIsLeftOutAndCountsItsOwnSteps) {
  const auto [world, stage] = GetParam();
  Plan base{world, stage, 0};
  auto init = Train(base);
  ASSERT_TRUE(init.ok()) << init.status();
  // a.w marked on every rank at steps 0-1: unchanged after them, bit for bit, while b moved.
  Plan two = {world, stage, 2};
  two.marked = [](int, int) { return true; };
  auto after_two = Train(two);
  ASSERT_TRUE(after_two.ok()) << after_two.status();
  EXPECT_EQ((*after_two)[0], (*init)[0]) << "a.w was updated without a gradient";
  EXPECT_NE((*after_two)[1], (*init)[1]) << "a.b was not updated";
  // With "zero" the same marks change nothing: a.w is decayed and moved by its zero gradient's moments.
  two.skip = false;
  auto zero = Train(two);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_NE((*zero)[0], (*init)[0]);
  // One rank's gradient is a gradient: marked on rank 0 only (at 2 ranks), a.w is updated.
  if (world > 1) {
    Plan one = {world, stage, 2};
    one.marked = [](int, int rank) { return rank == 0; };
    auto r = Train(one);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE((*r)[0], (*init)[0]) << "a.w was left out though rank 1 wrote it a gradient";
  }
  // Skipping steps 1-2 of 4 changes a.w and nothing else (the exact values, with a.w's own step count at
  // step 3, are checked against torch.optim.AdamW in tests/python/test_no_grad.py).
  Plan skipped = {world, stage, 4};
  skipped.marked = [](int step, int) { return step == 1 || step == 2; };
  auto s = Train(skipped);
  ASSERT_TRUE(s.ok()) << s.status();
  Plan plain = {world, stage, 4};
  auto p = Train(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE((*s)[0], (*p)[0]);
  EXPECT_EQ((*s)[2], (*p)[2]) << "c.w does not depend on a's marks";
  // A unit without a backward use in any step is left out whole.
  Plan no_c = {world, stage, 3};
  no_c.use_c = false;
  auto nc = Train(no_c);
  ASSERT_TRUE(nc.ok()) << nc.status();
  EXPECT_EQ((*nc)[2], (*init)[2]) << "c.w was updated with no use";
}

// The same skipped run gives the same bits at every stage and world size: the left-out segments and the
// per-parameter step counts do not depend on how the update range is sharded.
TEST(NoGradAcrossLayouts, TheSameBitsAtEveryStageAndWorldSize) {
  std::vector<std::vector<float>> first;
  for (int world : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      Plan r{world, stage, 5};
      r.marked = [](int step, int) { return step == 1 || step == 2 || step == 4; };
      auto v = Train(r);
      ASSERT_TRUE(v.ok()) << v.status();
      // The gradients depend on the rank, so each world size has its own expected bits; stage 0 sets them.
      if (stage == 0) first = *v;
      EXPECT_EQ(*v, first) << "world " << world << ", stage " << stage;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndRanks, NoGrad,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(0, 1, 2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return absl::StrCat("ranks", std::get<0>(info.param), "_stage", std::get<1>(info.param));
                         });

}  // namespace
}  // namespace strata::engine
