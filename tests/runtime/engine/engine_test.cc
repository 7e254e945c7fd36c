// Engine behaviour on the in-process back-end: stage equivalence against the single-rank stage-0
// reference, the analytic memory bound from the runtime's own accounting, prefetch overlap from recorded
// stream events, and the error paths (registration mismatch, order mismatch, dead peer, misuse).
#include "runtime/engine/engine.h"

#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::engine {
namespace {

using mlp::Mlp;
using mlp::MlpShape;
using strata::testing::RunRanks;
using ::testing::HasSubstr;

struct RunSpec {
  int world = 1;
  int stage = 0;
  int accum = 1;
  int steps = 8;
  int global_batch = 16;
  double clip = 0;
  int prefetch = 1;
  int64_t delay_us = 0;
  DType param_dtype = DType::kF32;
  OptimizerType optimizer = OptimizerType::kAdamW;
  int group = 0;  // zero_optimization.shard_group_size; 0 = the world
};

EngineConfig MakeConfig(const RunSpec& s) {
  EngineConfig c;
  c.stage = s.stage;
  c.gradient_accumulation_steps = s.accum;
  c.gradient_clipping = s.clip;
  c.prefetch_depth = s.prefetch;
  c.param_dtype = s.param_dtype;
  c.optimizer.type = s.optimizer;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.optimizer.momentum = s.optimizer == OptimizerType::kSgd ? 0.9 : 0.0;
  c.collective_timeout_ms = 20000;
  c.shard_group_size = s.group;
  return c;
}

// Trains the MLP and returns rank 0's consolidated parameters (and optionally the engine's timeline).
std::vector<float> Train(const RunSpec& s, std::vector<device::Span>* timeline = nullptr) {
  std::vector<float> params;
  std::mutex mu;
  auto results = RunRanks(s.world, comm::Options{}, [&](int rank, comm::Communicator& world) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(MakeConfig(s), world, dev));
    STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*e, MlpShape{}));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    const int micro = s.global_batch / (s.world * s.accum);
    for (int step = 0; step < s.steps; ++step) {
      if (step == s.steps - 1 && rank == 0 && timeline != nullptr) e->timeline().SetEnabled(true);
      for (int mb = 0; mb < s.accum; ++mb) {
        STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
        const int64_t first = int64_t{step} * s.global_batch + (int64_t{mb} * s.world + rank) * micro;
        STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(*e, first, micro, s.delay_us).status());
        STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
      }
      STRATA_RETURN_IF_ERROR(e->Step().status());
    }
    if (rank == 0 && timeline != nullptr) *timeline = e->timeline().Take();
    STRATA_ASSIGN_OR_RETURN(std::vector<float> all, e->GatherAllParams());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      params = std::move(all);
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < s.world; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  return params;
}

// Element-wise closeness: |got - want| <= rtol * max(|want|, rms(want)). Elements far below the typical
// parameter size are judged on the parameters' scale; otherwise summation-order rounding (1e-8 absolute)
// would dominate elements that happen to pass near zero.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty());
  double sq = 0;
  for (float w : want) sq += double(w) * w;
  const double rms = std::sqrt(sq / want.size());
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]) / std::max(std::fabs(double(want[i])), rms);
    if (!(err <= rtol) && reported++ < 5) {
      ADD_FAILURE() << what << ": index " << i << " expected " << want[i] << " actual " << got[i] << " (rel " << err
                    << ")";
    }
  }
}

TEST(Engine, StagesMatchSingleRankReference) {
  const std::vector<float> ref = Train(RunSpec{});
  for (int world : {2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      RunSpec s;
      s.world = world;
      s.stage = stage;
      ExpectClose(Train(s), ref, 1e-5, absl::StrCat("world ", world, " stage ", stage));
    }
  }
}

// A world whose collectives take device buffers (as NCCL's do), over an in-process one: only what
// ResolveShardGroups asks of it is real.
class DeviceBuffersWorld final : public comm::Communicator {
 public:
  explicit DeviceBuffersWorld(comm::Communicator& inner) : inner_(inner) { options_.name = "nccl-world"; }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const comm::Options& options() const override { return options_; }
  bool device_buffers() const override { return true; }
  comm::Work AllGather(const void* s, void* r, size_t n, DType t, device::Stream& st) override {
    return inner_.AllGather(s, r, n, t, st);
  }
  comm::Work ReduceScatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp o, device::Stream& st) override {
    return inner_.ReduceScatter(s, r, n, t, o, st);
  }
  comm::Work AllReduce(const void* s, void* r, size_t n, DType t, comm::ReduceOp o, device::Stream& st) override {
    return inner_.AllReduce(s, r, n, t, o, st);
  }
  comm::Work Broadcast(void* b, size_t n, DType t, int root, device::Stream& st) override {
    return inner_.Broadcast(b, n, t, root, st);
  }
  comm::Work Barrier(device::Stream& st) override { return inner_.Barrier(st); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Dup(const std::string& name, int64_t t) override {
    return inner_.Dup(name, t);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int c, int k, const std::string& name, int64_t t) override {
    return inner_.Split(c, k, name, t);
  }
  comm::Traffic traffic() const override { return inner_.traffic(); }
  void Abort(const absl::Status& cause) override { inner_.Abort(cause); }

 private:
  comm::Communicator& inner_;
  comm::Options options_;
};

// Stage 0 shards nothing: a shard group size given through the C++ config is refused as the parser
// refuses it (G = the world is today's behaviour and stays allowed).
TEST(Engine, ShardGroupsAtStageZeroAreRefused) {
  for (int g : {1, kShardGroupNode, 2}) {
    EngineConfig cfg;
    cfg.stage = 0;
    cfg.shard_group_size = g;
    auto results = testing::RunRanks(2, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
      device::HostDevice dev;
      return Engine::Create(cfg, c, dev).status();
    });
    for (const absl::Status& s : results) {
      if (g == 2) {
        EXPECT_TRUE(s.ok()) << s;
        continue;
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "G " << g << ": " << s;
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("shard_group_size needs ZeRO stage 1, 2 or 3"));
    }
  }
}

// "node" compares host names in host memory, which a device-buffer world cannot carry: refused by name
// at Create instead of handing host memory to NCCL.
TEST(Engine, NodeShardGroupsOverADeviceBufferWorldAreRefused) {
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.shard_group_size = kShardGroupNode;
  auto results = testing::RunRanks(2, comm::Options{}, [&](int, comm::Communicator& c) -> absl::Status {
    device::HostDevice dev;
    DeviceBuffersWorld world(c);
    return Engine::Create(cfg, world, dev).status();
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("is \"node\""));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("(nccl-world) takes device buffers only"));
  }
}

// Hybrid sharding on the in-process back-end (the MPI tests are engine_hybrid_mpi_test.cc): shard groups
// of 2 and 1 of 4 ranks, with accumulation (the replica all-reduce runs per micro-batch) and clipping
// (the norm is the shard group's).
TEST(Engine, ShardGroupsMatchSingleRankReference) {
  RunSpec base;
  base.accum = 2;
  base.clip = 0.05;
  const std::vector<float> ref = Train(base);
  for (int stage : {1, 2, 3}) {
    for (int group : {1, 2}) {
      RunSpec s = base;
      s.world = 4;
      s.stage = stage;
      s.group = group;
      ExpectClose(Train(s), ref, 1e-5, absl::StrCat("world 4 G ", group, " stage ", stage));
    }
  }
}

TEST(Engine, AccumulationAndClippingMatchReference) {
  for (int accum : {2, 4}) {
    RunSpec base;
    base.accum = accum;
    base.clip = 0.05;  // small enough to be active on every step
    const std::vector<float> ref = Train(base);
    for (int stage : {1, 3}) {
      RunSpec s = base;
      s.world = 2;
      s.stage = stage;
      ExpectClose(Train(s), ref, 1e-5, absl::StrCat("accum ", accum, " stage ", stage));
    }
  }
}

TEST(Engine, SgdMomentumMatchesReference) {
  RunSpec base;
  base.optimizer = OptimizerType::kSgd;
  base.global_batch = 24;  // divisible by 3 ranks
  const std::vector<float> ref = Train(base);
  RunSpec s = base;
  s.world = 3;
  s.stage = 3;
  ExpectClose(Train(s), ref, 1e-5, "sgd stage 3 world 3");
}

TEST(Engine, Bf16ParamsTrackFp32) {
  RunSpec f32;
  f32.world = 2;
  f32.stage = 3;
  RunSpec bf = f32;
  bf.param_dtype = DType::kBF16;
  const std::vector<float> a = Train(f32), b = Train(bf);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(a[i]) * a[i];
  }
  // bf16 compute copies (8-bit mantissa) over an fp32 master: a few 1e-3 relative after 8 steps.
  EXPECT_LT(std::sqrt(diff / norm), 2e-2);
  EXPECT_GT(std::sqrt(diff / norm), 0.0) << "bf16 run is bit-identical to fp32: the bf16 path is not used";
}

TEST(Engine, PrefetchOverlapsGatherWithPreviousCompute) {
  for (int prefetch : {1, 0}) {
    RunSpec s;
    s.world = 2;
    s.stage = 3;
    s.steps = 2;
    s.prefetch = prefetch;
    s.delay_us = 3000;
    std::vector<device::Span> tl;
    Train(s, &tl);
    std::vector<device::Span> compute, gathers;
    for (const auto& sp : tl) (sp.stream == "compute" ? compute : gathers).push_back(sp);
    ASSERT_GE(compute.size(), 8u);  // 4 forward + 4 backward uses
    int overlapped = 0, pairs = 0;
    for (size_t i = 0; i + 1 < compute.size(); ++i) {
      const int next = compute[i + 1].unit;
      if (next == compute[i].unit) continue;
      ++pairs;
      // The gather that fed use i+1: the latest gather of that unit starting before use i+1 began.
      const device::Span* feed = nullptr;
      for (const auto& g : gathers) {
        if (g.kind == "gather" && g.unit == next && g.start_ns <= compute[i + 1].start_ns &&
            (feed == nullptr || g.start_ns > feed->start_ns)) {
          feed = &g;
        }
      }
      ASSERT_NE(feed, nullptr) << "no gather for unit " << next;
      if (feed->start_ns < compute[i].end_ns) ++overlapped;
    }
    ASSERT_GT(pairs, 3);
    if (prefetch == 1) {
      EXPECT_EQ(overlapped, pairs) << "with prefetch, every next unit's gather starts before the current compute ends";
    } else {
      EXPECT_EQ(overlapped, 0) << "without prefetch, gathers start only on demand";
    }
  }
}

}  // namespace
}  // namespace strata::engine
