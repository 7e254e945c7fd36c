// Training through the C ABI: bit-for-bit the same parameters and step results as the same model driven
// through the C++ engine API (stages 0-3, gradient accumulation, a tied unit), the pointers and their
// lifetimes, a checkpoint save / load round trip, an asynchronous save (equal files, its failure at the next
// step), the stats (memory per tier, step time split) and the trace.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine.h"
#include "tests/files_under.h"
#include "tests/runtime/capi/capi_test_util.h"
#include "tests/runtime/capi/foreign_test_util.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::capi_test {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;

// `group` > 0: zero_optimization.shard_group_size (hybrid sharding).
std::string Config(int stage, int group = 0) {
  const std::string hybrid = group > 0 ? absl::StrCat(", \"shard_group_size\": ", group) : "";
  return absl::StrCat("{\"zero_optimization\": {\"stage\": ", stage, hybrid, "}, \"gradient_accumulation_steps\": 2, ",
                      "\"gradient_clipping\": 0.5, \"optimizer\": {\"params\": {\"lr\": 0.01}}, ",
                      "\"strata\": {\"seed\": 3, \"collective_timeout_ms\": 20000}}");
}

// The synthetic gradient of one backward use: depends on the parameters, the rank and the micro-batch.
void AddGrad(const float* param, float* grad, size_t n, int rank, int mb) {
  for (size_t i = 0; i < n; ++i) grad[i] += 0.01f * static_cast<float>(rank + 1 + mb) + 0.1f * param[i];
}

// Uses per micro-batch: a, b, a (tied) forward; then the reverse backward.
constexpr int kOrder[] = {0, 1, 0};
constexpr size_t kNumel[2][2] = {{32, 8}, {16, 2}};

struct Result {
  std::vector<float> params;  // every parameter, registration order
  std::vector<double> grad_norms;
  uint64_t device_bytes = 0;  // the device tier's current bytes after the last step
  int shard_group_size = 0;   // the C++ engine's
};

// The model through the C ABI, on one rank.
void TrainC(int rank, strata_comm* comm, int stage, Result* out, int group = 0) {
  strata_engine* e = nullptr;
  const std::string json = Config(stage, group);
  ASSERT_STRATA_OK(MakeEngine(comm, json.c_str(), true, &e));
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
      for (int u : kOrder) {
        strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
        ASSERT_STRATA_OK(strata_engine_begin_forward(e, u, &b));
        ASSERT_EQ(b.num_params, 2);
        ASSERT_EQ(b.grads, nullptr);
        ASSERT_STRATA_OK(strata_engine_end_forward(e, u));
      }
      for (int k = 2; k >= 0; --k) {
        const int u = kOrder[k];
        strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
        ASSERT_STRATA_OK(strata_engine_begin_backward(e, u, &b));
        for (int p = 0; p < 2; ++p) {
          void* same = nullptr;
          ASSERT_STRATA_OK(strata_engine_param(e, u, p, &same));
          ASSERT_EQ(same, b.params[p]);
          AddGrad(static_cast<const float*>(b.params[p]), b.grads[p], kNumel[u][p], rank, mb);
        }
        ASSERT_STRATA_OK(strata_engine_end_backward(e, u));
      }
      ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
    }
    strata_step_result r = STRATA_STEP_RESULT_INIT;
    ASSERT_STRATA_OK(strata_engine_step(e, &r));
    EXPECT_EQ(r.step, step + 1);
    EXPECT_EQ(r.skipped, 0);
    out->grad_norms.push_back(r.grad_norm);
  }
  strata_stats st = STRATA_STATS_INIT;
  ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
  out->device_bytes = st.device_current_bytes;
  for (int u = 0; u < 2; ++u) {
    for (int p = 0; p < 2; ++p) {
      std::vector<float> v(kNumel[u][p]);
      ASSERT_STRATA_OK(strata_engine_gather_param(e, u, p, v.data(), v.size()));
      out->params.insert(out->params.end(), v.begin(), v.end());
    }
  }
  EXPECT_STRATA_OK(strata_engine_destroy(e));
}

// The same model through the C++ engine, on one rank.
absl::Status TrainCxx(int rank, comm::Communicator& world, int stage, Result* out, int group = 0) {
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(engine::EngineConfig cfg, engine::ParseConfig(Config(stage, group)));
  STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(cfg, world, dev));
  using shard::Init;
  STRATA_RETURN_IF_ERROR(
      e->RegisterUnit("a", {{"w", {8, 4}, true, Init::Uniform(0.5f)}, {"b", {8}, false, Init::Zeros()}}).status());
  STRATA_RETURN_IF_ERROR(
      e->RegisterUnit("b", {{"w", {2, 8}, true, Init::Normal(0.3f)}, {"b", {2}, false, Init::Constant(0.1f)}})
          .status());
  STRATA_RETURN_IF_ERROR(e->Finalize());
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
      for (int u : kOrder) {
        STRATA_RETURN_IF_ERROR(e->BeginForward(u));
        STRATA_RETURN_IF_ERROR(e->EndForward(u));
      }
      for (int k = 2; k >= 0; --k) {
        const int u = kOrder[k];
        STRATA_RETURN_IF_ERROR(e->BeginBackward(u));
        for (int p = 0; p < 2; ++p) AddGrad(e->Param(u, p).f32(), e->Grad(u, p), kNumel[u][p], rank, mb);
        STRATA_RETURN_IF_ERROR(e->EndBackward(u));
      }
      STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    }
    STRATA_ASSIGN_OR_RETURN(engine::StepResult r, e->Step());
    out->grad_norms.push_back(r.grad_norm);
  }
  STRATA_ASSIGN_OR_RETURN(out->params, e->GatherAllParams());
  out->device_bytes = e->memory_stats().tier[static_cast<int>(memory::Tier::kDevice)].current_bytes;
  out->shard_group_size = e->shard_group_size();
  return absl::OkStatus();
}

class CApiTrain : public ::testing::TestWithParam<int> {};

TEST_P(CApiTrain, MatchesTheCxxEngineBitForBit) {
  const int stage = GetParam();
  std::vector<Result> c(kWorld), cxx(kWorld);
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) { TrainC(rank, comm, stage, &c[rank]); });
  const auto statuses = strata::testing::RunRanks(kWorld, comm::Options{}, [&](int rank, comm::Communicator& w) {
    return TrainCxx(rank, w, stage, &cxx[rank]);
  });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(c[r].params.size(), 58u);
    EXPECT_EQ(c[r].params, cxx[r].params) << "rank " << r << ", stage " << stage;
    EXPECT_EQ(c[r].grad_norms, cxx[r].grad_norms) << "rank " << r << ", stage " << stage;
  }
  EXPECT_NE(c[0].params, std::vector<float>(58, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Stages, CApiTrain, ::testing::Values(0, 1, 2, 3));

// zero_optimization.shard_group_size travels in the config JSON: at G = 1 of 2 ranks (data parallel
// with ZeRO's bookkeeping) the C engine holds what the C++ engine holds, twice the G = 2 state, and
// trains to the same bits.
TEST(CApiTrain, ShardGroupSizeInTheConfigJsonShardsLikeTheCxxEngine) {
  for (int stage : {1, 2, 3}) {
    std::vector<Result> c(kWorld), cxx(kWorld), whole(kWorld);
    RunCRanks(kWorld, [&](int rank, strata_comm* comm) { TrainC(rank, comm, stage, &c[rank], /*group=*/1); });
    RunCRanks(kWorld, [&](int rank, strata_comm* comm) { TrainC(rank, comm, stage, &whole[rank]); });
    const auto statuses = strata::testing::RunRanks(kWorld, comm::Options{}, [&](int rank, comm::Communicator& w) {
      return TrainCxx(rank, w, stage, &cxx[rank], /*group=*/1);
    });
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(cxx[r].shard_group_size, 1);
      EXPECT_EQ(c[r].params, cxx[r].params) << "rank " << r << ", stage " << stage;
      EXPECT_EQ(c[r].grad_norms, cxx[r].grad_norms) << "rank " << r << ", stage " << stage;
      EXPECT_EQ(c[r].device_bytes, cxx[r].device_bytes) << "rank " << r << ", stage " << stage;
      EXPECT_GT(c[r].device_bytes, whole[r].device_bytes)
          << "rank " << r << ", stage " << stage << ": G = 1 holds more";
    }
  }
}

// An engine over a foreign communicator (strata_comm_create_foreign, docs/decisions/0033) whose callbacks are
// the in-process back-end's trains to the bits of an engine over the in-process back-end itself: stages 0-3,
// at 3 ranks (sums of 3 terms) and with hybrid sharding (G = 1: the engine's splits go through the callbacks).
TEST(CApiTrain, OverAForeignCommunicatorMatchesTheInProcessOneBitForBit) {
  for (int stage : {0, 1, 2, 3}) {
    for (int group : {0, 1}) {
      if (stage == 0 && group > 0) continue;  // stage 0 shards nothing
      constexpr int kRanks = 3;
      std::vector<Result> foreign(kRanks), native(kRanks);
      RunCRanks(kRanks, [&](int rank, strata_comm* comm) { TrainC(rank, comm, stage, &native[rank], group); });
      auto job = std::make_shared<ForeignJobState>();
      RunForeignRanks(kRanks, 20000, job,
                      [&](int rank, strata_comm* comm) { TrainC(rank, comm, stage, &foreign[rank], group); });
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_EQ(foreign[r].params.size(), 58u);
        EXPECT_EQ(foreign[r].params, native[r].params) << "rank " << r << ", stage " << stage << ", G " << group;
        EXPECT_EQ(foreign[r].grad_norms, native[r].grad_norms) << "rank " << r << ", stage " << stage;
      }
      EXPECT_GT(job->made.load(), 3 * kRanks) << "the engine made its communicators through the callbacks";
    }
  }
}

// One step of a single micro-batch using both units once, adding `g` to every gradient; sleeps
// `compute_ms` inside unit a's forward (trainer compute, for the time split).
// The forward and backward use of both units in an open micro-batch, adding g to every gradient.
void UseUnits(strata_engine* e, float g, int compute_ms = 0) {
  for (int u = 0; u < 2; ++u) {
    ASSERT_STRATA_OK(strata_engine_begin_forward(e, u, nullptr));
    if (u == 0 && compute_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms));
    ASSERT_STRATA_OK(strata_engine_end_forward(e, u));
  }
  for (int u = 1; u >= 0; --u) {
    strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
    ASSERT_STRATA_OK(strata_engine_begin_backward(e, u, &b));
    for (int p = 0; p < 2; ++p) {
      for (size_t i = 0; i < kNumel[u][p]; ++i) b.grads[p][i] += g;
    }
    ASSERT_STRATA_OK(strata_engine_end_backward(e, u));
  }
}

void OneStep(strata_engine* e, float g, int compute_ms = 0) {
  ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
  UseUnits(e, g, compute_ms);
  ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
  ASSERT_STRATA_OK(strata_engine_step(e, nullptr));
}

std::vector<float> AllParams(strata_engine* e) {
  std::vector<float> all;
  for (int u = 0; u < 2; ++u) {
    for (int p = 0; p < 2; ++p) {
      std::vector<float> v(kNumel[u][p]);
      EXPECT_STRATA_OK(strata_engine_gather_param(e, u, p, v.data(), v.size()));
      all.insert(all.end(), v.begin(), v.end());
    }
  }
  return all;
}

TEST(CApiCheckpoint, SaveThenLoadResumesExactly) {
  const std::string root = ::testing::TempDir() + "/capi_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::vector<std::vector<float>> continued(kWorld), resumed(kWorld);
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    OneStep(e, 0.1f);
    OneStep(e, -0.2f);
    ASSERT_STRATA_OK(strata_engine_save_checkpoint(e, root.c_str(), "{\"data_position\": 32}"));
    EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, root.c_str(), nullptr), STRATA_ERR_ALREADY_EXISTS,
                        "already exists");
    OneStep(e, 0.3f);
    continued[rank] = AllParams(e);
    ASSERT_STRATA_OK(strata_engine_destroy(e));

    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    const char* trainer = nullptr;
    ASSERT_STRATA_OK(strata_engine_load_checkpoint(e, root.c_str(), &trainer));  // the latest step under root
    ASSERT_NE(trainer, nullptr);
    EXPECT_STREQ(trainer, "{\"data_position\":32}");
    strata_stats st = STRATA_STATS_INIT;
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    EXPECT_EQ(st.steps, 2);
    OneStep(e, 0.3f);
    resumed[rank] = AllParams(e);
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
  EXPECT_TRUE(std::filesystem::exists(root + "/step_00000002"));
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(resumed[r], continued[r]) << "rank " << r;
  std::filesystem::remove_all(root);
}

// docs/decisions/0036-async-checkpoints.md through the C ABI: the files equal the synchronous save's; a failed
// background write is returned by the next strata_engine_step, which can then be called again.
TEST(CApiCheckpoint, AsyncSaveEqualsTheSyncOneAndItsFailureIsReturnedByTheNextStep) {
  const std::string root = ::testing::TempDir() + "/capi_async_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  // A directory where rank 0's shard of step 3 goes: its rename fails on the writer thread.
  std::filesystem::create_directories(root + "/bad/step_00000003/shard_00000.bin/in_the_way");
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    OneStep(e, 0.1f);
    OneStep(e, -0.2f);
    ASSERT_STRATA_OK(strata_engine_save_checkpoint(e, (root + "/sync").c_str(), "{\"next_step\": 2}"));
    ASSERT_STRATA_OK(strata_engine_save_checkpoint_async(e, (root + "/async").c_str(), "{\"next_step\": 2}"));
    OneStep(e, 0.3f);
    ASSERT_STRATA_OK(strata_engine_wait_checkpoint(e));
    int32_t in_flight = -1;
    ASSERT_STRATA_OK(strata_engine_checkpoint_in_flight(e, &in_flight));
    EXPECT_EQ(in_flight, 0);
    EXPECT_STRATA_ERROR(strata_engine_checkpoint_in_flight(e, nullptr), STRATA_ERR_INVALID_ARGUMENT, "out");

    ASSERT_STRATA_OK(strata_engine_save_checkpoint_async(e, (root + "/bad").c_str(), nullptr));
    do {
      ASSERT_STRATA_OK(strata_engine_checkpoint_in_flight(e, &in_flight));
    } while (in_flight != 0);
    ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
    UseUnits(e, 0.4f, 0);
    ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
    EXPECT_NE(strata_engine_step(e, nullptr), STRATA_OK);
    EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr(root + "/bad/step_00000003' was not published"));
    strata_stats st = STRATA_STATS_INIT;
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    EXPECT_EQ(st.steps, 3) << "the step that returned the failure was taken";
    ASSERT_STRATA_OK(strata_engine_step(e, nullptr));  // called again, it is
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    EXPECT_EQ(st.steps, 4);
    EXPECT_NE(strata_engine_wait_checkpoint(e), STRATA_OK);
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
  const auto sync = testing::FilesUnder(root + "/sync/step_00000002"),
             async = testing::FilesUnder(root + "/async/step_00000002");
  EXPECT_TRUE(sync.count("manifest.json"));
  EXPECT_TRUE(sync == async);
  EXPECT_FALSE(std::filesystem::exists(root + "/bad/step_00000003/manifest.json"));
  std::filesystem::remove_all(root);
}

// strata.h promises an error code and message, never an abort, whatever the checkpoint holds.
TEST(CApiCheckpoint, HostileCheckpointIsAnErrorCodeNotAnAbort) {
  const std::string root = ::testing::TempDir() + "/capi_hostile_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  const std::string manifest = root + "/step_00000001/manifest.json";
  std::string good;
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    OneStep(e, 0.1f);
    ASSERT_STRATA_OK(strata_engine_save_checkpoint(e, root.c_str(), "{\"next_step\": 1}"));
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
  {
    std::ifstream in(manifest);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t trainer = good.find("\"trainer\": ");
  ASSERT_NE(trainer, std::string::npos);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::pair<std::string, std::string> edits[] = {
      {good.substr(trainer), "\"trainer\": " + deep + "}"},             // nested trainer state
      {"\"step\": 1", "\"step\": \"one\""},                            // wrong type
      {"\"step\": 1", "\"step\": -1"},                                 // negative
      {"\"shard_00001.bin\"", "\"../step_00000001/shard_00001.bin\""},  // outside the step directory
  };
  const char* want[] = {"deeper than", "field 'step'", "field 'step'", "shards[1].file"};
  for (size_t i = 0; i < std::size(edits); ++i) {
    std::string text = good;
    text.replace(text.find(edits[i].first), edits[i].first.size(), edits[i].second);
    std::ofstream(manifest) << text;
    RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
      strata_engine* e = nullptr;
      ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
      const char* out = "unset";
      EXPECT_STRATA_ERROR(strata_engine_load_checkpoint(e, root.c_str(), &out), STRATA_ERR_IO, want[i]);
      EXPECT_EQ(out, nullptr);
      ASSERT_STRATA_OK(strata_engine_destroy(e));
    });
  }
  std::filesystem::remove_all(root);
}

TEST(CApiStats, MemoryPerTierAndTheStepTimeSplit) {
  std::mutex mu;
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    strata_stats st = STRATA_STATS_INIT;
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    EXPECT_EQ(st.last_step_ms, 0.0) << "no step yet";
    EXPECT_GT(st.device_current_bytes, 0u);
    OneStep(e, 0.1f, /*compute_ms=*/30);
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(st.steps, 1);
    EXPECT_EQ(st.loss_scale, 1.0);
    EXPECT_GE(st.device_peak_bytes, st.device_current_bytes);
    EXPECT_EQ(st.pinned_host_peak_bytes, 0u);
    EXPECT_EQ(st.nvme_peak_bytes, 0u);
    EXPECT_GE(st.last_compute_ms, 30.0) << "rank " << rank << ": the sleep inside unit a's forward";
    EXPECT_GT(st.last_optimizer_ms, 0.0);
    EXPECT_EQ(st.last_exposed_io_ms, 0.0) << "no offload tier";
    EXPECT_GE(st.last_step_ms, st.last_compute_ms);
    const double parts = st.last_compute_ms + st.last_exposed_comm_ms + st.last_exposed_io_ms +
                         st.last_optimizer_ms + st.last_other_ms;
    EXPECT_NEAR(parts, st.last_step_ms, 1e-3) << "the parts sum to the step";
    ASSERT_STRATA_OK(strata_engine_reset_peak_memory(e));
    ASSERT_STRATA_OK(strata_engine_get_stats(e, &st));
    EXPECT_EQ(st.device_peak_bytes, st.device_current_bytes);
    float scale = 0;
    ASSERT_STRATA_OK(strata_engine_loss_scale(e, &scale));
    EXPECT_EQ(scale, 1.0f);
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

// A ZeRO-3 AdamW engine with lr 0.01 and the scheduler `scheduler` (its JSON).
void MakeScheduledEngine(strata_comm* comm, const std::string& scheduler, strata_engine** e) {
  const std::string config =
      "{\"zero_optimization\": {\"stage\": 3}, \"optimizer\": {\"type\": \"AdamW\", "
      "\"params\": {\"lr\": 0.01}}, \"scheduler\": " +
      scheduler + "}";
  ASSERT_STRATA_OK(MakeEngine(comm, config.c_str(), true, e));
}

// strata_engine_lr is the lr the next step uses (strata.deepspeed's get_lr() before and between steps).
TEST(CApiLr, IsTheLrTheNextStepUses) {
  RunCRanks(kWorld, [&](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    MakeScheduledEngine(comm, "{\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 3, \"warmup_min_lr\": 0}}",
                        &e);
    ASSERT_NE(e, nullptr);
    std::vector<double> used;
    for (int s = 0; s < 4; ++s) {
      double next = -1;
      ASSERT_STRATA_OK(strata_engine_lr(e, &next));
      ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
      UseUnits(e, 0.1f);
      ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
      strata_step_result r = STRATA_STEP_RESULT_INIT;
      ASSERT_STRATA_OK(strata_engine_step(e, &r));
      EXPECT_EQ(r.lr, next) << "step " << s;
      used.push_back(r.lr);
    }
    EXPECT_LT(used[0], used[3]) << "the warm-up moves the lr";
    EXPECT_EQ(used[3], 0.01) << "at the peak after the warm-up";
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
}

// strata_engine_group_lr is the lr the next step gives a parameter with its own lr: under WarmupCosineLR the
// group's lr times the schedule's ratio (DeepSpeed's org_lr * ratio); has_own_lr 0 is strata_engine_lr.
TEST(CApiLr, AGroupsLrFollowsTheSchedule) {
  RunCRanks(kWorld, [&](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    MakeScheduledEngine(
        comm, "{\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 2, \"total_num_steps\": 6}}", &e);
    ASSERT_NE(e, nullptr);
    for (int s = 0; s < 4; ++s) {
      double config = -1, same = -1, group = -1;
      ASSERT_STRATA_OK(strata_engine_lr(e, &config));
      ASSERT_STRATA_OK(strata_engine_group_lr(e, 0, 123.0, &same));
      ASSERT_STRATA_OK(strata_engine_group_lr(e, 1, 0.04, &group));
      EXPECT_EQ(same, config) << s;
      EXPECT_NEAR(group, 4 * config, 1e-15) << s;
      if (s > 1) {  // the log warm-up starts at 0 for two updates
        EXPECT_GT(group, 0) << s;
      }
      OneStep(e, 0.1f);
    }
    double out = 0;
    EXPECT_STRATA_ERROR(strata_engine_group_lr(e, 1, -0.5, &out), STRATA_ERR_INVALID_ARGUMENT,
                        "own_lr is -0.5; it must be finite and >= 0");
    EXPECT_STRATA_ERROR(strata_engine_group_lr(e, 1, 0.1, nullptr), STRATA_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_group_lr(nullptr, 1, 0.1, &out), STRATA_ERR_INVALID_ARGUMENT, "engine is NULL");
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
}

// The trace through the C ABI: the runtime's writer over the engine's timeline, every rank in rank 0's file.
TEST(CApiTrace, RecordsEachRanksGathersUsesAndStepsIntoOneFile) {
  const std::string path = ::testing::TempDir() + "/capi_trace.json";
  std::filesystem::remove(path);
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    EXPECT_STRATA_ERROR(strata_engine_write_trace(e, path.c_str()), STRATA_ERR_FAILED_PRECONDITION,
                        "no trace is being recorded");
    OneStep(e, 0.1f);  // before recording: not in the file
    ASSERT_STRATA_OK(strata_engine_trace_enable(e, 1));
    ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
    EXPECT_STRATA_ERROR(strata_engine_trace_enable(e, 1), STRATA_ERR_FAILED_PRECONDITION, "inside a step");
    UseUnits(e, 0.1f);
    ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
    ASSERT_STRATA_OK(strata_engine_step(e, nullptr));
    OneStep(e, 0.2f);
    OneStep(e, 0.3f);
    ASSERT_STRATA_OK(strata_engine_write_trace(e, rank == 0 ? path.c_str() : nullptr));
    ASSERT_STRATA_OK(strata_engine_trace_enable(e, 0));
    EXPECT_STRATA_ERROR(strata_engine_write_trace(e, path.c_str()), STRATA_ERR_FAILED_PRECONDITION,
                        "no trace is being recorded");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  // Calls that differ across ranks (rank 0 gives no path; then only rank 0 records) fail on every rank at
  // once, instead of pairing one call's collectives with the next call's.
  RunCRanks(kWorld, [&](int rank, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
    ASSERT_STRATA_OK(strata_engine_trace_enable(e, 1));
    OneStep(e, 0.1f);
    const std::string mine = ::testing::TempDir() + "/capi_trace_" + std::to_string(rank) + ".json";
    if (rank == 0) {
      EXPECT_STRATA_ERROR(strata_engine_write_trace(e, nullptr), STRATA_ERR_INVALID_ARGUMENT, "path is NULL");
    } else {
      EXPECT_STRATA_ERROR(strata_engine_write_trace(e, mine.c_str()), STRATA_ERR_FAILED_PRECONDITION,
                          "rank(s) 0 could not take part");
    }
    ASSERT_STRATA_OK(strata_engine_trace_enable(e, rank == 0 ? 1 : 0));
    EXPECT_STRATA_ERROR(strata_engine_write_trace(e, mine.c_str()), STRATA_ERR_FAILED_PRECONDITION,
                        rank == 0 ? "rank(s) 1 could not take part" : "no trace is being recorded");
    ASSERT_STRATA_OK(strata_engine_trace_enable(e, 1));
    EXPECT_STRATA_OK(strata_engine_write_trace(e, mine.c_str()));  // and the communicator is in step again
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::map<std::pair<int, std::string>, int> count;  // (rank, name) -> spans
  std::map<int, int> memory_counters;
  for (const auto& ev : doc["traceEvents"]) {
    if (ev["ph"] == "X") ++count[{ev["pid"].get<int>(), ev["name"].get<std::string>()}];
    if (ev["ph"] == "C") ++memory_counters[ev["pid"].get<int>()];
  }
  for (int r = 0; r < kWorld; ++r) {
    // Three recorded steps (the one before recording is not in the file): a forward and a backward use of
    // each unit per step, and at stage 3 at least one gather of each unit per step.
    for (const char* unit : {"a", "b"}) {
      EXPECT_EQ((count[{r, std::string("forward ") + unit}]), 3) << "rank " << r << " unit " << unit;
      EXPECT_EQ((count[{r, std::string("backward ") + unit}]), 3) << "rank " << r << " unit " << unit;
      EXPECT_GE((count[{r, std::string("gather ") + unit}]), 3) << "rank " << r << " unit " << unit;
    }
    EXPECT_EQ(memory_counters[r], 3 * 3) << "rank " << r << ": one counter per tier after each recorded step";
  }
}

// strata_param_spec.frozen through the ABI: the frozen unit is gathered in both passes but has no
// gradient buffers (NULL in strata_unit_buffers, an error from strata_engine_grad) and keeps its values
// bit for bit while the trainable unit learns.
TEST(CApiFrozen, AFrozenUnitIsGatheredButHasNoGradientsAndNeverChanges) {
  RunCRanks(kWorld, [&](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
    o.config_json = "{\"zero_optimization\": {\"stage\": 3}}";
    ASSERT_STRATA_OK(strata_engine_create(comm, &o, &e));
    strata_param_spec a[2] = {Spec("w", kShapeAW, 2, 1, STRATA_INIT_UNIFORM, 0.5f),
                              Spec("b", kShapeAB, 1, 0, STRATA_INIT_CONSTANT, 0.2f)};
    a[0].frozen = 1;
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "a", a, 2, nullptr), STRATA_ERR_INVALID_ARGUMENT,
                        "unit 'a' mixes frozen parameters (w) and trainable ones (b)");
    a[1].frozen = 1;
    const strata_param_spec b[2] = {Spec("w", kShapeBW, 2, 1, STRATA_INIT_NORMAL, 0.3f),
                                    Spec("b", kShapeBB, 1, 0, STRATA_INIT_CONSTANT, 0.1f)};
    ASSERT_STRATA_OK(strata_engine_register_unit(e, "a", a, 2, nullptr));
    ASSERT_STRATA_OK(strata_engine_register_unit(e, "b", b, 2, nullptr));
    ASSERT_STRATA_OK(strata_engine_finalize(e));
    const std::vector<float> before = AllParams(e);
    for (int step = 0; step < 2; ++step) {
      ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
      for (int u = 0; u < 2; ++u) {
        ASSERT_STRATA_OK(strata_engine_begin_forward(e, u, nullptr));
        ASSERT_STRATA_OK(strata_engine_end_forward(e, u));
      }
      for (int u = 1; u >= 0; --u) {
        strata_unit_buffers bufs = STRATA_UNIT_BUFFERS_INIT;
        ASSERT_STRATA_OK(strata_engine_begin_backward(e, u, &bufs));
        for (int p = 0; p < 2; ++p) {
          ASSERT_NE(bufs.params[p], nullptr);
          if (u == 0) {
            EXPECT_EQ(bufs.grads[p], nullptr);
            float* g = nullptr;
            EXPECT_STRATA_ERROR(strata_engine_grad(e, u, p, &g), STRATA_ERR_FAILED_PRECONDITION,
                                "unit 'a' is frozen: it has no gradients");
            continue;
          }
          for (size_t i = 0; i < kNumel[u][p]; ++i) bufs.grads[p][i] += 0.1f;
        }
        ASSERT_STRATA_OK(strata_engine_end_backward(e, u));
      }
      ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
      ASSERT_STRATA_OK(strata_engine_step(e, nullptr));
    }
    const std::vector<float> after = AllParams(e);
    const size_t frozen = kNumel[0][0] + kNumel[0][1];
    EXPECT_EQ(0, std::memcmp(before.data(), after.data(), frozen * sizeof(float))) << "the frozen unit changed";
    EXPECT_NE(before[frozen], after[frozen]) << "the trainable unit did not learn";
    ASSERT_STRATA_OK(strata_engine_destroy(e));
  });
}

}  // namespace
}  // namespace strata::capi_test
