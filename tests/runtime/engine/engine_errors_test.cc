// Every error path the engine claims: registration mismatch across ranks, unit order that differs from
// the recorded one, a dead peer (an error naming it within the timeout, never a hang), misuse of the
// hook protocol, pool exhaustion, and a non-finite gradient on one rank skipping the step everywhere.
#include <chrono>
#include <cmath>
#include <latch>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using ::testing::HasSubstr;
using shard::Init;
using shard::ParamSpec;

std::vector<ParamSpec> Linear(int n) {
  return {ParamSpec{"w", {n, n}, true, Init::Normal(0.1f)}, ParamSpec{"b", {n}, false, Init::Zeros()}};
}

// Registers `units` linear units of width 8 and finalizes; with `together`, once every rank has registered
// them, so that Finalize's collectives (the first on the engine's communicators) start on every rank at once.
absl::StatusOr<std::unique_ptr<Engine>> Build(const EngineConfig& cfg, comm::Communicator& c, device::Device& d,
                                              int units = 2, std::latch* together = nullptr) {
  STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, c, d));
  for (int u = 0; u < units; ++u) STRATA_RETURN_IF_ERROR(e->RegisterUnit(absl::StrCat("u", u), Linear(8)).status());
  if (together != nullptr) together->arrive_and_wait();
  STRATA_RETURN_IF_ERROR(e->Finalize());
  return e;
}

// One micro-batch using units in `order` forward and reverse backward, adding `grad` to every gradient.
absl::Status MicroBatch(Engine& e, const std::vector<int>& order, float grad = 0.01f) {
  STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
  for (int u : order) {
    STRATA_RETURN_IF_ERROR(e.BeginForward(u));
    STRATA_RETURN_IF_ERROR(e.EndForward(u));
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    STRATA_RETURN_IF_ERROR(e.BeginBackward(*it));
    for (int p = 0; p < 2; ++p) {
      float* g = e.Grad(*it, p);
      for (size_t i = 0; i < e.layout(*it).params[p].numel; ++i) g[i] += grad;
    }
    STRATA_RETURN_IF_ERROR(e.EndBackward(*it));
  }
  return e.EndMicroBatch();
}

EngineConfig Stage3(int64_t timeout_ms = 20000) {
  EngineConfig c;
  c.stage = 3;
  c.collective_timeout_ms = timeout_ms;
  return c;
}

TEST(EngineErrors, DifferentRegistrationsFailOnEveryRank) {
  auto results = testing::RunRanks(3, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Stage3(), c, d));
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("u0", Linear(8)).status());
    STRATA_RETURN_IF_ERROR(e->RegisterUnit("u1", Linear(rank == 2 ? 9 : 8)).status());
    return e->Finalize();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("differ across ranks")) << "rank " << r;
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("unit #1")) << "rank " << r;
  }
}

// Note [One configuration]: a setting that differs on one rank fails every rank at Create, naming the key
// and each rank's value; settings that may differ per rank (threads, budgets, the timeout) are accepted.
TEST(EngineErrors, DifferentConfigurationsFailOnEveryRankNamingTheKey) {
  auto results = testing::RunRanks(3, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    EngineConfig cfg = Stage3();
    if (rank == 2) cfg.optimizer.lr = 2e-3;
    if (rank == 1) cfg.seed = 7;  // a later key: only the first difference is named
    return Engine::Create(cfg, c, d).status();
  });
  for (int r = 0; r < 3; ++r) {
    const std::string m(results[r].message());
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << m;
    EXPECT_THAT(m, HasSubstr("optimizer.params.lr is 0.001 on ranks 0,1 but 0.002 on rank 2")) << m;
  }
  results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    EngineConfig cfg = Stage3();
    cfg.offload_param.device = rank == 0 ? OffloadDevice::kCpu : OffloadDevice::kNone;
    cfg.stage = rank == 0 ? 3 : 2;  // rank 1's alone would be refused locally: the agreement comes first
    return Engine::Create(cfg, c, d).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("zero_optimization.stage is 3 on rank 0 but 2 on rank 1"))
        << results[r];
  }
  results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    EngineConfig cfg = Stage3(rank == 0 ? 20000 : 30000);
    cfg.optimizer_threads = rank + 1;
    cfg.host_budget_bytes = rank == 0 ? ~uint64_t{0} : uint64_t{1} << 30;
    cfg.release_idle_memory = rank == 1;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(cfg, c, d));
    return MicroBatch(*e, {0, 1});
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(EngineErrors, DifferentUnitCountsFailOnEveryRank) {
  auto results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    return Build(Stage3(), c, d, rank == 0 ? 2 : 3).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("registered 2")) << "rank " << r << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("registered 3")) << "rank " << r << results[r];
  }
}

TEST(EngineErrors, OrderDifferentFromRecordedIsAnErrorNamingBothUnits) {
  auto results = testing::RunRanks(2, comm::Options{}, [](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d));
    STRATA_RETURN_IF_ERROR(MicroBatch(*e, {0, 1}));
    STRATA_RETURN_IF_ERROR(e->Step().status());
    return MicroBatch(*e, {1, 0});
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("forward of unit 'u1'"));
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("forward of unit 'u0'"));
  }
}

// Note [Agreed schedule]: ranks that take different paths in the first micro-batch (a head per rank) fail
// alike on every rank, at every stage, naming what each rank was about to use, before any collective of it.
TEST(EngineErrors, RanksTakingDifferentPathsInTheFirstMicroBatchFailOnEveryRank) {
  for (int stage = 0; stage <= 3; ++stage) {
    const auto start = std::chrono::steady_clock::now();
    auto results = testing::RunRanks(3, comm::Options{}, [stage](int rank, comm::Communicator& c) -> absl::Status {
      device::HostDevice d;
      EngineConfig cfg = Stage3();
      cfg.stage = stage;
      STRATA_ASSIGN_OR_RETURN(auto e, Build(cfg, c, d, 3));  // three units of the same size
      return MicroBatch(*e, {0, rank == 1 ? 2 : 1});
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < 3; ++r) {
      const std::string m(results[r].message());
      EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition)
          << "stage " << stage << ", rank " << r << ": " << m;
      EXPECT_THAT(m, HasSubstr("different paths through the model at use #1 of the first micro-batch")) << stage;
      EXPECT_THAT(m, HasSubstr("ranks 0,2: the forward of unit 'u1'")) << stage;
      EXPECT_THAT(m, HasSubstr("rank 1: the forward of unit 'u2'")) << stage;
      EXPECT_THAT(m, HasSubstr("root unit")) << "the remedy, stage " << stage;
    }
    EXPECT_LT(secs, 5.0) << "stage " << stage;
  }
}

// A rank that ends its first micro-batch while its peers use one more unit: every rank fails, naming both.
TEST(EngineErrors, ARankEndingTheFirstMicroBatchEarlyFailsEveryRank) {
  auto results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d, 3));
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    for (int u : rank == 0 ? std::vector<int>{0} : std::vector<int>{0, 2}) {
      STRATA_RETURN_IF_ERROR(e->BeginForward(u));
      STRATA_RETURN_IF_ERROR(e->EndForward(u));
      STRATA_RETURN_IF_ERROR(e->BeginBackward(u));
      STRATA_RETURN_IF_ERROR(e->EndBackward(u));
    }
    return e->EndMicroBatch();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("at use #2 of the first micro-batch")) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 0: the end of the micro-batch")) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 1: the forward of unit 'u2'")) << results[r];
  }
}

// After the record, a rank that deviates fails on its own check before issuing anything, and its peers,
// waiting in a collective it will never join, fail within seconds naming it and its cause (Note [Failure
// notices]), at every stage, though the collective timeout is a minute.
TEST(EngineErrors, ADeviationAfterTheRecordEndsEveryRankWithinSecondsNamingTheRank) {
  for (int stage = 0; stage <= 3; ++stage) {
    comm::Options opts;
    opts.timeout_ms = 60000;
    const auto start = std::chrono::steady_clock::now();
    auto results = testing::RunRanks(3, opts, [stage](int rank, comm::Communicator& c) -> absl::Status {
      device::HostDevice d;
      EngineConfig cfg = Stage3(60000);
      cfg.stage = stage;
      STRATA_ASSIGN_OR_RETURN(auto e, Build(cfg, c, d, 3));
      STRATA_RETURN_IF_ERROR(MicroBatch(*e, {0, 1, 2}));
      STRATA_RETURN_IF_ERROR(e->Step().status());
      STRATA_RETURN_IF_ERROR(
          MicroBatch(*e, rank == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2}));  // rank 2 skips u1
      return e->Step().status();  // stages 0-2 wait here for the reductions
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(results[2].code(), absl::StatusCode::kFailedPrecondition) << "stage " << stage << ": " << results[2];
    EXPECT_THAT(std::string(results[2].message()), HasSubstr("forward of unit 'u2'")) << stage;
    for (int r = 0; r < 2; ++r) {
      const std::string m(results[r].message());
      EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << "stage " << stage << ", rank " << r << ": " << m;
      EXPECT_THAT(m, HasSubstr("rank 2 failed and will not join it")) << stage << ": " << m;
      EXPECT_THAT(m, HasSubstr("unit order differs from the recorded one")) << stage << ": " << m;
    }
    EXPECT_LT(secs, 5.0) << "stage " << stage << ": the peers must not wait for the 60 s timeout";
  }
}

// Evaluation forwards at stage 3 gather and record nothing: each use is agreed, so ranks evaluating
// different units fail alike, and one rank evaluating alone fails naming that every rank must run them.
TEST(EngineErrors, EvaluationForwardsAtStage3AreAgreedAcrossRanks) {
  auto results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d, 3));
    STRATA_RETURN_IF_ERROR(e->BeginForward(0));
    STRATA_RETURN_IF_ERROR(e->EndForward(0));
    return e->BeginForward(rank == 0 ? 1 : 2);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()),
                HasSubstr("different paths through the model in an evaluation forward"))
        << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 1: the evaluation forward of unit 'u2'"));
  }
  // Rank 0 evaluates while rank 1 begins training: both fail at once, told that it is the loop, not a path.
  results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d));
    if (rank == 0) return e->BeginForward(0);
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    return e->BeginForward(0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 0: the evaluation forward of unit 'u0'"));
    EXPECT_THAT(std::string(results[r].message()),
                HasSubstr("Some ranks ran a forward outside a training micro-batch"));
  }
  // Under a collective timeout of 300 ms, rank 0 alone evaluates. The world communicator keeps its long deadline
  // for the configuration's agreement, and the engine's collectives start together: however slow one rank's
  // setup, only the evaluation forward waits for a missing rank.
  std::latch built(2);
  results = testing::RunRanks(2, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(300), c, d, 2, &built));
    if (rank == 1) return absl::OkStatus();  // rank 1 does not evaluate
    return e->BeginForward(0);
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("every rank must run the same evaluation forwards"));
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("rank(s) 1"));
}

// As above, the short timeout is the engine's, whose collectives start together: rank 1 dies after them.
TEST(EngineErrors, DeadPeerFailsWithinTimeoutNamingTheRank) {
  const auto start = std::chrono::steady_clock::now();
  std::latch built(2);
  auto results = testing::RunRanks(2, comm::Options{}, [&](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(300), c, d, 2, &built));
    if (rank == 1) return absl::OkStatus();  // rank 1 "dies" after initialisation
    return MicroBatch(*e, {0, 1});
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("rank(s) 1"));
  EXPECT_LT(secs, 5.0) << "the dead peer must be reported within a bounded time";
}

TEST(EngineErrors, HookMisuseIsReported) {
  auto results = testing::RunRanks(1, comm::Options{}, [](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto pre, Engine::Create(Stage3(), c, d));
    EXPECT_THAT(std::string(pre->BeginForward(0).message()), HasSubstr("before Finalize"));
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d));
    EXPECT_THAT(std::string(e->BeginBackward(0).message()), HasSubstr("outside a micro-batch"));
    EXPECT_THAT(std::string(e->Step().status().message()), HasSubstr("after 0 micro-batches"));
    EXPECT_EQ(e->BeginForward(7).code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(std::string(e->RegisterUnit("late", Linear(2)).status().message()), HasSubstr("after Finalize"));
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(e->BeginForward(0));
    STRATA_RETURN_IF_ERROR(e->EndForward(0));
    absl::Status s = e->EndMicroBatch();
    EXPECT_THAT(std::string(s.message()), HasSubstr("1 forward but 0 backward"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
}

TEST(EngineErrors, MoreLiveUnitsThanThePoolIsResourceExhausted) {
  auto results = testing::RunRanks(1, comm::Options{}, [](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    EngineConfig cfg = Stage3();
    cfg.max_live_units = 1;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(cfg, c, d));
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(e->BeginForward(0));
    return e->BeginForward(1);  // u0 still holds the only buffer
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kResourceExhausted) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("max_live_units=1"));
}

TEST(EngineErrors, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  auto results = testing::RunRanks(2, comm::Options{}, [](int rank, comm::Communicator& c) -> absl::Status {
    device::HostDevice d;
    STRATA_ASSIGN_OR_RETURN(auto e, Build(Stage3(), c, d));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> before, e->GatherParam(0, 0));
    STRATA_RETURN_IF_ERROR(MicroBatch(*e, {0, 1}, rank == 1 ? NAN : 0.01f));
    STRATA_ASSIGN_OR_RETURN(StepResult r, e->Step());
    EXPECT_TRUE(r.skipped) << "rank " << rank;
    EXPECT_EQ(r.step, 0) << "rank " << rank;
    STRATA_ASSIGN_OR_RETURN(std::vector<float> after, e->GatherParam(0, 0));
    EXPECT_EQ(before, after) << "rank " << rank << ": a skipped step changed the weights";
    // The next clean step updates normally.
    STRATA_RETURN_IF_ERROR(MicroBatch(*e, {0, 1}));
    STRATA_ASSIGN_OR_RETURN(StepResult r2, e->Step());
    EXPECT_FALSE(r2.skipped);
    STRATA_ASSIGN_OR_RETURN(std::vector<float> later, e->GatherParam(0, 0));
    EXPECT_NE(before, later);
    return absl::OkStatus();
  });
  for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(EngineErrors, ParameterOffloadBelowStage3IsRejectedAtCreate) {
  for (OffloadDevice where : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
      device::HostDevice d;
      EngineConfig cfg = Stage3();
      cfg.stage = 2;
      cfg.offload_param.device = where;  // parameter shards exist only at stage 3 (DeepSpeed's rule too)
      cfg.offload_param.nvme_path = "/tmp";
      return Engine::Create(cfg, c, d).status();
    });
    EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(results[0].message()), ::testing::HasSubstr("offload_param needs ZeRO stage 3"));
  }
}

}  // namespace
}  // namespace strata::engine
