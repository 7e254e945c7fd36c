// Hybrid sharding (zero_optimization.shard_group_size, docs/design.md "Hybrid sharding") under real MPI at 4
// ranks: shard groups of G = 2 replicated twice, against G = 4 (ZeRO over the world) and 1 rank.
//   equivalence  the MLP after 20 fp32 steps at stages 1-3, G = 1, 2, 4 == 1 rank: per-tensor relative
//                L2 <= 1e-5 and element-wise 1e-5 (docs/decisions/0003); the gradient norm of every step
//                equals G = 4's (the shard group's sum is the global one);
//   memory       per-rank state bytes from the engine's accounting: 16P/G at stage 3 (fp32, pad-free
//                units), 4P + 12P/G at stage 2, 8P + 8P/G at stage 1;
//   traffic      what each communicator issued in one step equals the layout's formula (Note [Traffic]);
//   checkpoints  saved at N = 4, G = 2 (one shard group writes G shards) and loaded at N = 2 G = 2,
//                N = 1 and N = 4 G = 4: the same weights bit for bit, and the same training after.
// Smaller worlds are Split() off the 4-rank world, so one mpirun runs every configuration.
// Run as `mpirun -n 4 engine_hybrid_mpi_test` (ctest does; other sizes skip).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/mlp/mlp_model.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/mpi_gtest_main.h"

namespace strata::engine {
namespace {

comm::MpiRuntime* g_runtime = nullptr;
bool g_report = false;  // rank 0 prints the measured errors

using mlp::Mlp;
using mlp::MlpShape;

// Every parameter a multiple of 16 elements and every unit of 64 (= 4 ranks x 16): no padding at
// G = 1, 2 or 4, so P is the model's own parameter count.
constexpr MlpShape kShape{16, 64, 64};
constexpr int kGlobalBatch = 16;

struct RunSpec {
  int stage = 3;
  int group = 0;  // zero_optimization.shard_group_size; 0 = the world
  int steps = 20;
  int prefetch = 1;
  OffloadDevice offload_param = OffloadDevice::kNone, offload_optimizer = OffloadDevice::kNone;
  std::string nvme_path;
};

struct Outcome {
  std::vector<std::vector<float>> params;  // per unit, whole (padding included), after the last step
  std::vector<double> norms;               // every step's gradient norm
  uint64_t state_bytes = 0;                // params + grads + master + optimizer state, every tier
  CommTraffic last_step;                   // what the last step issued, per communicator
  std::vector<size_t> unit_elems, used_elems;
  int shard_group_size = 0;
};

EngineConfig Config(const RunSpec& r) {
  EngineConfig c;
  c.stage = r.stage;
  c.shard_group_size = r.group;
  c.prefetch_depth = r.prefetch;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.collective_timeout_ms = 30000;
  c.offload_param.device = r.offload_param;
  c.offload_optimizer.device = r.offload_optimizer;
  c.offload_param.nvme_path = c.offload_optimizer.nvme_path = r.nvme_path;
  return c;
}

// Removes a SharedTempDir once every rank is done with it.
absl::Status RemoveShared(comm::Communicator& world, const std::string& dir) {
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto s, dev.CreateStream("barrier"));
  STRATA_RETURN_IF_ERROR(world.Barrier(*s).Wait());
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

// A fresh directory every rank names the same (rank 0 makes it); empty on failure.
std::string SharedTempDir(comm::Communicator& world) {
  std::vector<char> dir(256, 0);
  if (world.rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "strata_hybrid_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) std::snprintf(dir.data(), dir.size(), "%s", tmpl.c_str());
  }
  device::HostDevice dev;
  auto s = dev.CreateStream("bcast");
  if (!s.ok() || !comm::BroadcastBytes(world, dir.data(), dir.size(), 0, **s).Wait().ok()) return "";
  return std::string(dir.data());
}

std::unique_ptr<comm::Communicator> World() {
  comm::Options o;
  o.timeout_ms = 30000;
  auto w = g_runtime->World(o);
  return w.ok() ? std::move(*w) : nullptr;
}

// A sub-world: the ranks of the 4-rank world with the same color.
std::unique_ptr<comm::Communicator> Part(comm::Communicator& world, int color) {
  auto p = world.Split(color, world.rank(), absl::StrCat("part", color));
  return p.ok() ? std::move(*p) : nullptr;
}

CommTraffic Delta(const CommTraffic& after, const CommTraffic& before) {
  return CommTraffic{after.gather - before.gather,   after.reduce - before.reduce,
                     after.replica - before.replica, after.step - before.step,
                     after.control - before.control, after.group_control - before.group_control};
}

// Trains steps [first_step, first_step + r.steps) of the global sample sequence on `world`.
absl::Status TrainSteps(Engine& e, Mlp& mlp, const RunSpec& r, int first_step, Outcome* out) {
  const int n = e.world_size(), micro = kGlobalBatch / n;
  for (int step = first_step; step < first_step + r.steps; ++step) {
    const CommTraffic before = e.comm_traffic();
    STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
    STRATA_RETURN_IF_ERROR(mlp.TrainMicroBatch(e, int64_t{step} * kGlobalBatch + e.rank() * micro, micro).status());
    STRATA_RETURN_IF_ERROR(e.EndMicroBatch());
    STRATA_ASSIGN_OR_RETURN(StepResult s, e.Step());
    out->norms.push_back(s.grad_norm);
    out->last_step = Delta(e.comm_traffic(), before);
  }
  return absl::OkStatus();
}

absl::Status Collect(Engine& e, Outcome* out) {
  const MemoryStats m = e.memory_stats();
  out->state_bytes = 0;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    for (memory::Kind k : {memory::Kind::kParamShard, memory::Kind::kGradShard, memory::Kind::kMaster,
                           memory::Kind::kOptimizerState}) {
      out->state_bytes += m.kind[t][static_cast<int>(k)].current_bytes;
    }
  }
  out->params.clear();
  out->unit_elems.clear();
  out->used_elems.clear();
  for (int u = 0; u < e.num_units(); ++u) {
    STRATA_ASSIGN_OR_RETURN(std::vector<float> full, e.GatherUnit(u));
    out->params.push_back(std::move(full));
    out->unit_elems.push_back(e.layout(u).total_elems);
    out->used_elems.push_back(e.layout(u).used_elems);
  }
  out->shard_group_size = e.shard_group_size();
  return absl::OkStatus();
}

// Creates the engine on `world`, optionally loads `load_dir`, trains, optionally saves to `save_dir`.
absl::StatusOr<Outcome> TrainMlp(comm::Communicator& world, const RunSpec& r, const std::string& load_dir = "",
                                 int first_step = 0, const std::string& save_dir = "") {
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Config(r), world, dev));
  STRATA_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Register(*e, kShape));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  if (!load_dir.empty()) STRATA_RETURN_IF_ERROR(e->LoadCheckpoint(load_dir).status());
  Outcome out;
  STRATA_RETURN_IF_ERROR(TrainSteps(*e, mlp, r, first_step, &out));
  if (!save_dir.empty()) STRATA_RETURN_IF_ERROR(e->SaveCheckpoint(save_dir, "{}"));
  STRATA_RETURN_IF_ERROR(Collect(*e, &out));
  return out;
}

// docs/decisions/0003: per tensor (here per parameter run of a unit, the whole unit being its
// parameters back to back without padding) ||a - b|| / ||b||, and element-wise against max(|b|, rms(b)).
void ExpectEquivalent(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  double worst_l2 = 0, worst_elem = 0;
  for (size_t u = 0; u < want.params.size(); ++u) {
    const std::vector<float>& a = got.params[u];
    const std::vector<float>& b = want.params[u];
    const size_t n = std::min(got.used_elems[u], want.used_elems[u]);
    ASSERT_GE(a.size(), n);
    ASSERT_GE(b.size(), n);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      norm += double(b[i]) * b[i];
    }
    const double rel_l2 = std::sqrt(diff / norm), rms = std::sqrt(norm / double(n));
    EXPECT_LE(rel_l2, 1e-5) << what << ": unit " << u << " relative L2 error " << rel_l2;
    worst_l2 = std::max(worst_l2, rel_l2);
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const double err = std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), rms);
      worst_elem = std::max(worst_elem, err);
      if (!(err <= 1e-5) && bad++ < 3) {
        ADD_FAILURE() << what << ": unit " << u << " index " << i << " expected " << b[i] << " actual " << a[i];
      }
    }
  }
  if (g_report)
    std::printf("%s: worst per-tensor relative L2 %.2e, element-wise %.2e\n", what.c_str(), worst_l2, worst_elem);
}

void ExpectBitwise(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t u = 0; u < want.params.size(); ++u) {
    const size_t n = std::min(got.used_elems[u], want.used_elems[u]);
    for (size_t i = 0; i < n; ++i) {
      if (got.params[u][i] != want.params[u][i]) {
        ADD_FAILURE() << what << ": unit " << u << " index " << i << " expected " << want.params[u][i] << " actual "
                      << got.params[u][i];
        break;
      }
    }
  }
}

class Hybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(g_runtime, nullptr);
    if (g_runtime->world_size() != 4) GTEST_SKIP() << "needs 4 ranks (mpirun -n 4)";
    g_report = g_runtime->world_rank() == 0;
    world_ = World();
    ASSERT_NE(world_, nullptr);
    alone_ = Part(*world_, world_->rank());  // this rank by itself: the 1-rank reference
    ASSERT_NE(alone_, nullptr);
  }
  std::unique_ptr<comm::Communicator> world_, alone_;
};

TEST_F(Hybrid, ShardGroupsOfTwoMatchTheWorldAndOneRankAtEveryStage) {
  for (int stage : {1, 2, 3}) {
    RunSpec r;
    r.stage = stage;
    auto ref = TrainMlp(*alone_, r);
    ASSERT_TRUE(ref.ok()) << ref.status();
    r.group = 4;
    auto zero = TrainMlp(*world_, r);
    ASSERT_TRUE(zero.ok()) << zero.status();
    EXPECT_EQ(zero->shard_group_size, 4);
    for (int g : {2, 1}) {
      r.group = g;
      auto hybrid = TrainMlp(*world_, r);
      ASSERT_TRUE(hybrid.ok()) << hybrid.status();
      const std::string what = absl::StrCat("stage ", stage, " G=", g);
      EXPECT_EQ(hybrid->shard_group_size, g) << what;
      ExpectEquivalent(*hybrid, *ref, what + " vs 1 rank");
      ExpectEquivalent(*hybrid, *zero, what + " vs G=4");
      ASSERT_EQ(hybrid->norms.size(), zero->norms.size());
      // Step 1 starts from the same weights: only the order of the sums differs.
      EXPECT_NEAR(hybrid->norms[0], zero->norms[0], 1e-6 * zero->norms[0]) << what;
      for (size_t s = 0; s < zero->norms.size(); ++s) {
        EXPECT_NEAR(hybrid->norms[s], zero->norms[s], 1e-5 * zero->norms[s]) << what << " step " << s + 1;
      }
    }
  }
}

TEST_F(Hybrid, StateBytesAreSixteenPOverGAtStageThree) {
  for (int stage : {1, 2, 3}) {
    for (int g : {1, 2, 4}) {
      RunSpec r;
      r.stage = stage;
      r.group = g;
      r.steps = 1;
      auto o = TrainMlp(*world_, r);
      ASSERT_TRUE(o.ok()) << o.status();
      uint64_t p = 0;
      for (size_t u = 0; u < o->unit_elems.size(); ++u) {
        ASSERT_EQ(o->unit_elems[u], o->used_elems[u]) << "the test model must be pad-free";
        p += o->unit_elems[u];
      }
      ASSERT_EQ(p % 4, 0u);
      const uint64_t want = stage == 3 ? 16 * p / g : stage == 2 ? 4 * p + 12 * p / g : 8 * p + 8 * p / g;
      EXPECT_EQ(o->state_bytes, want) << "stage " << stage << " G=" << g << " P=" << p;
    }
  }
}

// Note [Traffic]: one step of one micro-batch. Without prefetch every use of a unit gathers it
// (reshard_after_forward): the MLP uses input and output once and the tied hidden unit twice per pass.
TEST_F(Hybrid, EachCommunicatorMovesTheLayoutsBytesPerStep) {
  const uint64_t uses[] = {2, 4, 2};  // forward + backward gathers of input, hidden, output
  for (int stage : {1, 2, 3}) {
    for (int g : {2, 4}) {
      RunSpec r;
      r.stage = stage;
      r.group = g;
      r.steps = 2;
      r.prefetch = 0;
      auto o = TrainMlp(*world_, r);
      ASSERT_TRUE(o.ok()) << o.status();
      const std::string what = absl::StrCat("stage ", stage, " G=", g);
      uint64_t gathered = 0, whole = 0, shard = 0;
      for (size_t u = 0; u < o->unit_elems.size(); ++u) {
        gathered += uses[u] * o->unit_elems[u] * 4;
        whole += o->unit_elems[u] * 4;
        shard += o->unit_elems[u] / g * 4;
      }
      const CommTraffic& t = o->last_step;
      const uint64_t units = o->unit_elems.size();
      using C = comm::Collective;
      EXPECT_EQ(t.gather.total_bytes(), stage == 3 ? gathered : 0) << what;
      EXPECT_EQ(t.gather.bytes_of(C::kAllGather), t.gather.total_bytes()) << what;
      // Stages 2-3 reduce-scatter each unit in the group; stage 1 all-reduces the full gradients over the world.
      EXPECT_EQ(t.reduce.total_bytes(), whole) << what;
      EXPECT_EQ(t.reduce.calls_of(stage == 1 ? C::kAllReduce : C::kReduceScatter), units) << what;
      const bool replicated = g < 4 && stage >= 2;
      EXPECT_EQ(t.replica.bytes_of(C::kAllReduce), replicated ? shard : 0) << what;
      EXPECT_EQ(t.replica.calls_of(C::kAllReduce), replicated ? units : 0) << what;
      EXPECT_EQ(t.step.bytes_of(C::kAllGather), stage == 3 ? 0 : whole) << what;  // re-replication of the slices
      // The norm: one float, within the shard group (the step communicator's own without replicas).
      const comm::Traffic& norm = g < 4 ? t.group_control : t.step;
      EXPECT_EQ(norm.bytes_of(C::kAllReduce), 4u) << what;
      EXPECT_EQ(t.control.total_bytes(), 0u) << what;
    }
  }
}

// One shard group writes G shards; the checkpoint loads at other N and G with the same bits, and
// the optimizer state with them (training on after the load matches training on without it).
TEST_F(Hybrid, CheckpointAtGroupsOfTwoLoadsAtOtherWorldsAndGroups) {
  const std::string root = SharedTempDir(*world_);
  ASSERT_FALSE(root.empty());
  RunSpec r;
  r.stage = 3;
  r.group = 2;
  r.steps = 5;
  auto saved = TrainMlp(*world_, r, "", 0, root + "/g2");
  ASSERT_TRUE(saved.ok()) << saved.status();
  RunSpec on = r;
  on.steps = 3;
  auto continued = TrainMlp(*world_, on, root + "/g2", 5);  // steps 6-8 at N=4 G=2
  ASSERT_TRUE(continued.ok()) << continued.status();

  auto man = checkpoint::ReadManifest(root + "/g2");
  ASSERT_TRUE(man.ok()) << man.status();
  EXPECT_EQ(man->world_size, 2);
  EXPECT_EQ(man->replicas, 2);
  EXPECT_EQ(man->shards.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(root + "/g2/shard_00002.bin")) << "only one shard group writes";

  std::unique_ptr<comm::Communicator> pair = Part(*world_, world_->rank() / 2);
  ASSERT_NE(pair, nullptr);
  struct Target {
    comm::Communicator* world;
    int group;
    const char* what;
  } targets[] = {{pair.get(), 2, "N=2 G=2"}, {alone_.get(), 0, "N=1"}, {world_.get(), 4, "N=4 G=4"},
                 {world_.get(), 1, "N=4 G=1"}};
  for (const Target& t : targets) {
    RunSpec load = r;
    load.group = t.group;
    load.steps = 0;
    auto loaded = TrainMlp(*t.world, load, root + "/g2", 5);
    ASSERT_TRUE(loaded.ok()) << t.what << ": " << loaded.status();
    ExpectBitwise(*loaded, *saved, std::string("loaded at ") + t.what);
    load.steps = 3;
    auto trained = TrainMlp(*t.world, load, root + "/g2", 5);
    ASSERT_TRUE(trained.ok()) << t.what << ": " << trained.status();
    ExpectEquivalent(*trained, *continued, std::string("3 steps after loading at ") + t.what);
  }
  // And the other way: saved by the whole world, loaded into groups of two.
  r.group = 4;
  auto zero = TrainMlp(*world_, r, "", 0, root + "/g4");
  ASSERT_TRUE(zero.ok()) << zero.status();
  RunSpec load = r;
  load.group = 2;
  load.steps = 0;
  auto loaded = TrainMlp(*world_, load, root + "/g4", 5);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectBitwise(*loaded, *zero, "G=4 checkpoint loaded at G=2");
  EXPECT_TRUE(RemoveShared(*world_, root).ok());
}

// Offloaded state (pinned host, NVMe) in shard groups: the same arithmetic, so the same bits as in memory.
TEST_F(Hybrid, OffloadedStateInShardGroupsGivesTheSameBits) {
  const std::string nvme = SharedTempDir(*world_);
  ASSERT_FALSE(nvme.empty());
  RunSpec base;
  base.group = 2;
  base.steps = 4;
  auto plain = TrainMlp(*world_, base);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::pair<OffloadDevice, OffloadDevice> variants[] = {{OffloadDevice::kNone, OffloadDevice::kCpu},
                                                              {OffloadDevice::kCpu, OffloadDevice::kCpu},
                                                              {OffloadDevice::kNvme, OffloadDevice::kNvme}};
  for (const auto& [param, optimizer] : variants) {
    RunSpec r = base;
    r.offload_param = param;
    r.offload_optimizer = optimizer;
    r.nvme_path = nvme;
    auto o = TrainMlp(*world_, r);
    ASSERT_TRUE(o.ok()) << o.status();
    ExpectBitwise(*o, *plain, absl::StrCat("offload_param ", int(param), ", offload_optimizer ", int(optimizer)));
  }
  EXPECT_TRUE(RemoveShared(*world_, nvme).ok());
}

// "node": the ranks sharing this host, here all 4: ZeRO over the world.
TEST_F(Hybrid, NodeGroupsTheRanksOfThisHost) {
  RunSpec r;
  r.group = kShardGroupNode;
  r.steps = 1;
  auto o = TrainMlp(*world_, r);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shard_group_size, 4);
}

TEST_F(Hybrid, GroupSizeThatDoesNotDivideTheWorldFailsOnEveryRankNamingTheKey) {
  RunSpec r;
  r.group = 3;
  auto o = TrainMlp(*world_, r);
  EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << o.status();
  EXPECT_NE(std::string(o.status().message()).find("zero_optimization.shard_group_size"), std::string::npos)
      << o.status();
}

}  // namespace
}  // namespace strata::engine

int main(int argc, char** argv) {
  return strata::testing::RunMpiTests(argc, argv, "engine_hybrid_mpi_test", &strata::engine::g_runtime);
}
