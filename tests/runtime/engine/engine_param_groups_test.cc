// Note [Param groups] (runtime/optim/optimizer.cc): parameters with their own lr and weight decay (a torch param
// group's) train, bit for bit, as they would in an engine whose config has those values, for AdamW, Adam with
// L2 (adam_w_mode false) and SGD, at stages 0-3, 1 and 2 ranks, with the optimizer state in memory and on NVMe,
// and with the schedules: WarmupCosineLR scales a group's lr, WarmupDecayLR gives every group its peak. The
// values cross the checkpoint: a resume with another group lr or decay is refused naming the parameter, one
// that states the config's values loads a checkpoint saved without own values, and the other way round.
// Ranks that register other own values are refused at Finalize.
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "runtime/optim/optimizer.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using shard::Init;
using shard::ParamSpec;
using ::testing::HasSubstr;

constexpr double kLr = 1e-2, kWd = 0.1;        // the config's
constexpr double kOwnLr = 3e-2, kOwnWd = 0.3;  // group 1's (a.w, a.b)

enum class Kind { kAdamW, kAdamL2, kSgd };

struct Plan {
  int world = 1, stage = 0, steps = 4;
  Kind kind = Kind::kAdamW;
  optim::LrScheduleType schedule = optim::LrScheduleType::kConstant;
  bool nvme = false;
  // a.w's and a.b's own lr, a.w's own decay (b does not decay); unset = the config's. c.w has none.
  std::optional<double> own_lr, own_wd;
  double lr = kLr, wd = kWd;                               // the config's
  std::string load, save;                                  // step directories
  std::function<std::optional<double>(int rank)> rank_lr;  // a.w's own lr per rank, when set
};

EngineConfig Config(const Plan& run) {
  EngineConfig c;
  c.stage = run.stage;
  c.optimizer.type = run.kind == Kind::kSgd ? optim::OptimizerType::kSgd : optim::OptimizerType::kAdamW;
  c.optimizer.adam_w_mode = run.kind != Kind::kAdamL2;
  c.optimizer.momentum = 0.9;
  c.optimizer.lr = run.lr;
  c.optimizer.weight_decay = run.wd;
  c.scheduler.type = run.schedule;
  if (run.schedule != optim::LrScheduleType::kConstant) {
    c.scheduler.warmup_steps = 2;
    c.scheduler.total_steps = 5;
    c.scheduler.shared_peak = run.schedule == optim::LrScheduleType::kWarmupDecayLR;
  }
  if (run.nvme) {
    c.offload_optimizer.device = OffloadDevice::kNvme;
    c.offload_optimizer.nvme_path =
        absl::StrCat(::testing::TempDir(), "/groups_nvme_", ::getpid(), "_", run.world, "_", run.stage);
    c.offload_optimizer.pin_memory = false;
  }
  return c;
}

// Units "a" (w[4,3] decayed, b[3] not, both in group 1 when own values are set) and "c" (w[37] decayed, the
// config's). The gradients do not depend on the weights, so each parameter's values depend on its own
// coefficients alone. Returns every parameter's value after the steps, on rank 0.
absl::StatusOr<std::vector<std::vector<float>>> Train(const Plan& run) {
  std::vector<std::vector<float>> out;
  if (run.nvme) std::filesystem::create_directories(Config(run).offload_optimizer.nvme_path);
  auto results = testing::RunRanks(run.world, comm::Options{}, [&](int rank, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Config(run), comm, dev));
    ParamSpec aw{"w", {4, 3}, true, Init::Normal(0.5f)}, ab{"b", {3}, false, Init::Uniform(0.3f)};
    aw.own_lr = ab.own_lr = run.own_lr;
    aw.own_weight_decay = run.own_wd;  // b does not decay: no own decay
    if (run.rank_lr) aw.own_lr = run.rank_lr(rank);
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("a", {aw, ab}).status());
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("c", {ParamSpec{"w", {37}, true, Init::Normal(0.5f)}}).status());
    STRATA_RETURN_IF_ERROR(e->Finalize());
    if (!run.load.empty()) STRATA_RETURN_IF_ERROR(e->LoadCheckpoint(run.load).status());
    for (int step = 0; step < run.steps; ++step) {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      for (int u : {0, 1}) {
        STRATA_RETURN_IF_ERROR(e->BeginForward(u));
        STRATA_RETURN_IF_ERROR(e->EndForward(u));
      }
      for (int u : {1, 0}) {
        STRATA_RETURN_IF_ERROR(e->BeginBackward(u));
        for (int p = 0; p < static_cast<int>(e->layout(u).params.size()); ++p) {
          float* g = e->Grad(u, p);
          for (size_t i = 0; i < e->layout(u).params[p].numel; ++i) {
            g[i] += 0.01f * static_cast<float>((1 + i % 3) * (1 + rank + step)) * (p == 1 ? -1.0f : 1.0f);
          }
        }
        STRATA_RETURN_IF_ERROR(e->EndBackward(u));
      }
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      STRATA_RETURN_IF_ERROR(e->Step().status());
    }
    if (!run.save.empty()) STRATA_RETURN_IF_ERROR(e->SaveCheckpoint(run.save, "{}"));
    for (auto [u, p] : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}}) {
      STRATA_ASSIGN_OR_RETURN(std::vector<float> v, e->GatherParam(u, p));
      if (rank == 0) out.push_back(v);
    }
    return absl::OkStatus();
  });
  if (run.nvme) std::filesystem::remove_all(Config(run).offload_optimizer.nvme_path);
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

// `run` with a's parameters in group 1 (kOwnLr, kOwnWd).
Plan Grouped(Plan run) {
  run.own_lr = kOwnLr;
  run.own_wd = kOwnWd;
  return run;
}

// `grouped` without own values, its config holding group 1's decay, and its lr too when `lr`.
Plan AsConfig(Plan grouped, bool lr) {
  grouped.own_lr = grouped.own_wd = std::nullopt;
  grouped.wd = kOwnWd;
  if (lr) grouped.lr = kOwnLr;
  return grouped;
}

std::string Name(Kind k) { return k == Kind::kAdamW ? "adamw" : k == Kind::kAdamL2 ? "adam-l2" : "sgd"; }

class Groups : public ::testing::TestWithParam<std::tuple<int, int>> {};

// a's parameters in group 1 get the bits of a run whose config has group 1's lr and decay; c's the bits of a
// run with the config's values. A run without the groups differs (the test can fail).
TEST_P(Groups, AGroupsParametersTrainAsAConfigWithItsValues) {
  const auto [world, stage] = GetParam();
  for (const Kind kind : {Kind::kAdamW, Kind::kAdamL2, Kind::kSgd}) {
    for (const bool nvme : {false, true}) {
      if (nvme && stage == 0) continue;  // NVMe optimizer state needs stage >= 1
      Plan run{world, stage, 4, kind};
      run.nvme = nvme;
      const Plan grouped = Grouped(run);
      auto got = Train(grouped);
      ASSERT_TRUE(got.ok()) << got.status();
      auto a_ref = Train(AsConfig(grouped, true));  // a's values as the config's
      ASSERT_TRUE(a_ref.ok()) << a_ref.status();
      Plan plain = grouped;
      plain.own_lr = plain.own_wd = std::nullopt;
      auto c_ref = Train(plain);
      ASSERT_TRUE(c_ref.ok()) << c_ref.status();
      const std::string what = absl::StrCat(Name(kind), nvme ? " nvme" : "", " world ", world, " stage ", stage);
      EXPECT_EQ((*got)[0], (*a_ref)[0]) << what << ": a.w";
      EXPECT_EQ((*got)[1], (*a_ref)[1]) << what << ": a.b";
      EXPECT_EQ((*got)[2], (*c_ref)[2]) << what << ": c.w";
      EXPECT_NE((*got)[0], (*c_ref)[0]) << what << ": the group changed nothing";
      EXPECT_NE((*got)[1], (*c_ref)[1]) << what << ": the group's lr did not reach a.b";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, Groups,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(0, 1, 2, 3)));

// WarmupCosineLR: the group's lr times the schedule's ratio, which is the schedule of a config with the group's
// lr. WarmupDecayLR: every group rises to the config's peak; the group's own decay still applies.
TEST(GroupsUnderSchedules, CosineScalesTheGroupsLrDecayGivesEveryGroupThePeak) {
  for (const auto schedule : {optim::LrScheduleType::kWarmupCosineLR, optim::LrScheduleType::kWarmupDecayLR}) {
    Plan run{2, 3, 5};
    run.schedule = schedule;
    const Plan grouped = Grouped(run);
    auto got = Train(grouped);
    ASSERT_TRUE(got.ok()) << got.status();
    // WarmupDecayLR: the config's peak, not the group's lr
    auto ref = Train(AsConfig(grouped, schedule == optim::LrScheduleType::kWarmupCosineLR));
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ((*got)[0], (*ref)[0]) << int(schedule);
    EXPECT_EQ((*got)[1], (*ref)[1]) << int(schedule);
  }
}

// Engine::next_lr(own) is the schedule's lr for the group, optim::GroupLr, before and after steps.
TEST(GroupsUnderSchedules, NextLrOfAGroupIsItsScheduledLr) {
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& comm) -> absl::Status {
    device::HostDevice dev;
    Plan run;
    run.schedule = optim::LrScheduleType::kWarmupCosineLR;
    const EngineConfig cfg = Config(run);
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, comm, dev));
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("a", {ParamSpec{"w", {3}, true}}).status());
    STRATA_RETURN_IF_ERROR(e->Finalize());
    for (int step = 0; step < 4; ++step) {
      EXPECT_EQ(e->next_lr(kOwnLr), optim::GroupLr(cfg.scheduler, kLr, kOwnLr, step)) << step;
      EXPECT_EQ(e->next_lr(std::nullopt), e->next_lr());
      if (step > 1) {  // the log warm-up starts at 0 for two updates
        EXPECT_NEAR(e->next_lr(kOwnLr) / e->next_lr(), kOwnLr / kLr, 1e-12) << step;
      }
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      STRATA_RETURN_IF_ERROR(e->BeginForward(0));
      STRATA_RETURN_IF_ERROR(e->EndForward(0));
      STRATA_RETURN_IF_ERROR(e->BeginBackward(0));
      e->Grad(0, 0)[0] = 1.0f;
      STRATA_RETURN_IF_ERROR(e->EndBackward(0));
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      STRATA_ASSIGN_OR_RETURN(StepResult r, e->Step());
      EXPECT_EQ(r.lr, optim::GroupLr(cfg.scheduler, kLr, std::nullopt, step)) << "the config's group's lr";
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(GroupsAcrossRanks, OtherOwnValuesOnAnotherRankAreRefused) {
  Plan run{2, 3, 1};
  run.rank_lr = [](int rank) { return rank == 0 ? std::optional<double>(kOwnLr) : std::nullopt; };
  auto got = Train(run);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("unit registrations differ across ranks"));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("own lr / weight decay"));
}

TEST(GroupsInCheckpoints, AResumeWithOtherGroupValuesIsRefusedNamingTheParameter) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/groups_ckpt_", ::getpid());
  std::filesystem::remove_all(root);
  Plan save = Grouped(Plan{2, 2, 2});
  save.save = root + "/grouped";
  ASSERT_TRUE(Train(save).ok());
  const std::string step_dir = save.save;
  Plan load = save;
  load.save.clear();
  load.steps = 1;
  load.load = step_dir;
  load.world = 1;  // any world size
  auto same = Train(load);
  EXPECT_TRUE(same.ok()) << same.status();

  load.own_lr = 5e-2;
  auto other_lr = Train(load);
  ASSERT_FALSE(other_lr.ok());
  EXPECT_THAT(std::string(other_lr.status().message()),
              HasSubstr("parameter 'a.w' has its own lr 0.05 here but 0.03 in the checkpoint"));
  load.own_lr = std::nullopt;
  auto config_lr = Train(load);
  ASSERT_FALSE(config_lr.ok());
  EXPECT_THAT(std::string(config_lr.status().message()),
              HasSubstr("parameter 'a.w' takes the config's lr 0.01 here but had its own 0.03 in the checkpoint"));
  load.own_lr = kOwnLr;
  load.own_wd = 0.2;
  auto other_wd = Train(load);
  ASSERT_FALSE(other_wd.ok());
  EXPECT_THAT(std::string(other_wd.status().message()),
              HasSubstr("parameter 'a.w' has its own weight decay 0.2 here but 0.3 in the checkpoint"));

  // A checkpoint without own values (an older one) loads into a run whose groups state the config's values,
  // and not into one with another value.
  Plan old = {2, 2, 2};
  old.save = root + "/plain";
  ASSERT_TRUE(Train(old).ok());
  Plan stated = {2, 2, 1};
  stated.load = old.save;
  stated.own_lr = kLr;
  stated.own_wd = kWd;
  auto stated_run = Train(stated);
  EXPECT_TRUE(stated_run.ok()) << stated_run.status();
  stated.own_wd = kOwnWd;
  auto other = Train(stated);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("parameter 'a.w' has its own weight decay 0.3 here but none in the checkpoint (the "
                        "config's, 0.1 in this run)"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace strata::engine
