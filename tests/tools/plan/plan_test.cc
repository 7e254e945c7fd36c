// `strata plan` against the engine it plans for: the memory it predicts per tier equals, byte for byte,
// the peak the engine's MemoryTracker records over real steps of a small GPT (every stage, fp32 and
// bf16, optimizer and parameter offload to the host and NVMe, shard groups = the world), and its activation
// bytes equal what the model's workspace allocated. Then the alpha-beta model, the JSON schema, the
// search, and the errors bad input gets.
#include "tools/plan/plan.h"

#include <chrono>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/spec/gpt_spec.h"
#include "models/gpt/train/trainer.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/engine/rank_harness.h"
#include "tools/plan/plan_options.h"

namespace strata::tools::plan {
namespace {

using engine::OffloadDevice;

struct Case {
  const char* name;
  int ranks;
  int stage;
  DType dtype;
  OffloadDevice optimizer = OffloadDevice::kNone;
  OffloadDevice params = OffloadDevice::kNone;
  bool checkpointing = false;
  int micro_batch = 2;
  int shard_group = 0;  // zero_optimization.shard_group_size; 0 = the world
};

gpt::GptConfig SmallGpt() { return gpt::GptConfig{2, 32, 2, 16, 64}; }  // odd sizes: padding in every unit

PlanInput HostInput(const Case& c) {
  PlanInput in;
  in.model = gpt::Spec(SmallGpt());
  in.engine.stage = c.stage;
  in.engine.param_dtype = c.dtype;
  in.engine.bf16 = c.dtype == DType::kBF16;
  in.engine.train_micro_batch_size_per_gpu = c.micro_batch;
  in.engine.offload_optimizer.device = c.optimizer;
  in.engine.offload_param.device = c.params;
  in.engine.nvme_tile_elems = 1024;  // several tiles per unit
  in.checkpointing = c.checkpointing;
  in.engine.shard_group_size = c.shard_group;
  in.shard_group = c.shard_group;
  in.ranks = c.ranks;
  in.ranks_per_node = c.ranks;
  in.device = *DevicePreset("host");
  in.device.matmul_flops = 1e10;
  in.device.intra = Link{1e-6, 1e9, 1e9, 1e9};
  in.device.host_memory_bytes_per_s = 1e10;
  return in;
}

struct Measured {
  uint64_t tier[3] = {0, 0, 0};
  uint64_t workspace = 0;
};

// Two steps of the GPT on the engine, rank 0's tracker peaks and workspace.
absl::StatusOr<Measured> RunSteps(const PlanInput& in, const std::string& nvme_dir) {
  engine::EngineConfig cfg = in.engine;
  cfg.offload_optimizer.nvme_path = cfg.offload_param.nvme_path = nvme_dir;
  Measured out;
  const gpt::GptConfig& model = *gpt::ConfigOf(*in.model);
  auto results = testing::RunRanks(in.ranks, comm::Options{}, [&](int rank, comm::Communicator& world) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(GptRun run, BringUp(cfg, model, world, dev));
    const int B = cfg.train_micro_batch_size_per_gpu, T = model.seq_len;
    std::vector<int32_t> tokens(size_t(B) * T);
    std::mt19937 rng(1 + rank);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % model.vocab);
    for (int step = 0; step < 2; ++step) {
      STRATA_RETURN_IF_ERROR(RunMicroBatches(run, cfg.gradient_accumulation_steps, B, in.checkpointing,
                                             [&](int) -> absl::StatusOr<MicroBatchInput> {
                                               return MicroBatchInput{tokens.data(), tokens.data(), 1.0f};
                                             })
                                 .status());
      STRATA_RETURN_IF_ERROR(run.engine->Step().status());
    }
    if (rank == 0) {
      const engine::MemoryStats m = run.engine->memory_stats();
      for (int t = 0; t < 3; ++t) out.tier[t] = m.tier[t].peak_bytes;
      out.workspace = run.model.workspace_bytes();
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return out;
}

class PlanMatchesEngine : public ::testing::TestWithParam<Case> {};

TEST_P(PlanMatchesEngine, PeakBytesPerTierAndWorkspaceAreExact) {
  const Case& c = GetParam();
  const PlanInput in = HostInput(c);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/plan_nvme_", c.name);
  std::filesystem::create_directories(dir);
  absl::StatusOr<Plan> p = Evaluate(in);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<Measured> m = RunSteps(in, dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const char* tiers[] = {"device", "pinned_host", "nvme"};
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(p->memory.engine.tier[t], m->tier[t]) << c.name << ": tier " << tiers[t];
  }
  EXPECT_EQ(p->memory.activations, m->workspace) << c.name;
  // On a host device the trainer's bytes are host memory, beside the tiers.
  EXPECT_EQ(p->memory.tier[0], p->memory.engine.tier[0]);
  EXPECT_EQ(p->memory.host_resident, p->memory.activations + p->memory.unit_copy);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PlanMatchesEngine,
    ::testing::Values(
        Case{"stage0_fp32", 2, 0, DType::kF32}, Case{"stage1_fp32", 2, 1, DType::kF32},
        Case{"stage2_bf16", 2, 2, DType::kBF16}, Case{"stage3_fp32", 3, 3, DType::kF32},
        Case{"stage3_bf16_ckpt", 2, 3, DType::kBF16, OffloadDevice::kNone, OffloadDevice::kNone, true},
        Case{"stage2_cpu_optimizer", 2, 2, DType::kF32, OffloadDevice::kCpu},
        Case{"stage3_cpu_both", 2, 3, DType::kBF16, OffloadDevice::kCpu, OffloadDevice::kCpu},
        Case{"stage3_nvme_optimizer", 2, 3, DType::kF32, OffloadDevice::kNvme},
        Case{"stage3_nvme_params", 2, 3, DType::kBF16, OffloadDevice::kCpu, OffloadDevice::kNvme},
        Case{"stage1_single_rank", 1, 1, DType::kBF16},
        // Hybrid sharding: shard groups of 2 in a world of 4.
        Case{"stage1_g2", 4, 1, DType::kF32, OffloadDevice::kNone, OffloadDevice::kNone, false, 2, 2},
        Case{"stage2_g2_bf16", 4, 2, DType::kBF16, OffloadDevice::kNone, OffloadDevice::kNone, false, 2, 2},
        Case{"stage3_g2", 4, 3, DType::kF32, OffloadDevice::kNone, OffloadDevice::kNone, false, 2, 2},
        Case{"stage3_g2_cpu_optimizer", 4, 3, DType::kBF16, OffloadDevice::kCpu, OffloadDevice::kNone, false, 2, 2}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(PlanMemory, ShardGroupLaysOutAsAWorldOfG) {
  // The state of a G-rank group at 2G ranks equals that of a G-rank world (the replicas hold copies).
  PlanInput world = HostInput(Case{"g", 2, 3, DType::kF32});
  PlanInput hybrid = world;
  hybrid.ranks = 4;
  hybrid.ranks_per_node = 4;
  hybrid.shard_group = 2;
  absl::StatusOr<MemoryPlan> a = PlanMemory(world), b = PlanMemory(hybrid);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int t = 0; t < 3; ++t) EXPECT_EQ(a->tier[t], b->tier[t]);
}

TEST(PlanMemory, LargestMicroBatchIsTheLastThatFits) {
  PlanInput in = HostInput(Case{"fit", 2, 3, DType::kF32});
  in.device.gpu = true;  // the workspace counts against the device
  in.device.h2d_bytes_per_s = 1e9;
  absl::StatusOr<Plan> one = Evaluate(in);
  ASSERT_TRUE(one.ok()) << one.status();
  in.engine.train_micro_batch_size_per_gpu = 5;
  absl::StatusOr<MemoryPlan> five = PlanMemory(in);
  ASSERT_TRUE(five.ok());
  in.device.memory_bytes = five->tier[0];  // exactly 5 fits
  absl::StatusOr<Plan> p = Evaluate(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->max_micro_batch, 5);
  in.device.memory_bytes = five->tier[0] - 1;
  p = Evaluate(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->max_micro_batch, 4);
  EXPECT_FALSE(p->memory.fits);
  EXPECT_NE(p->memory.why_not.find("tier 'device'"), std::string::npos) << p->memory.why_not;
}

TEST(AlphaBeta, RingCostsFollowTheBusBandwidthConvention) {
  const Link l{2e-6, 100e9, 50e9, 80e9};
  const uint64_t X = 800'000'000;
  EXPECT_DOUBLE_EQ(AllGatherSeconds(X, 8, l), 7 * 2e-6 + (7.0 / 8) * X / 100e9);
  EXPECT_DOUBLE_EQ(ReduceScatterSeconds(X, 8, l), 7 * 2e-6 + (7.0 / 8) * X / 50e9);
  EXPECT_DOUBLE_EQ(AllReduceSeconds(X, 8, l), 2 * (7 * 2e-6 + (7.0 / 8) * X / 80e9));
  EXPECT_EQ(AllGatherSeconds(X, 1, l), 0);   // one rank moves nothing
  EXPECT_EQ(AllReduceSeconds(0, 8, l), 0);
}

PlanInput GpuInput(int ranks, int stage) {
  PlanInput in;
  in.model = gpt::Spec(*gpt::GptPreset("gpt2-xl"));
  in.engine.stage = stage;
  in.engine.param_dtype = DType::kBF16;
  in.engine.bf16 = true;
  in.engine.train_micro_batch_size_per_gpu = 4;
  in.ranks = ranks;
  in.ranks_per_node = 8;
  in.device = *DevicePreset("h200-sxm");
  return in;
}

TEST(PlanTime, ComputeIsTheModelsFlopsAtTheStatedFraction) {
  PlanInput in = GpuInput(8, 3);
  absl::StatusOr<TimePlan> t = PlanTime(in);
  ASSERT_TRUE(t.ok());
  const gpt::GptConfig& m = *gpt::ConfigOf(*in.model);
  const double flops = 3 * gpt::ForwardFlopsPerToken(m) * 4 * m.seq_len;
  EXPECT_NEAR(t->compute_s, flops / (989e12 * 0.5), 1e-9 * t->compute_s);
  EXPECT_GE(t->step_s, t->compute_s);
  EXPECT_LE(t->exposed_comm_s, t->gather_s + t->reduce_s + 1e-12);
}

TEST(PlanTime, CrossingNodesCostsMoreThanStayingInOne) {
  // The same 64-rank job: shard groups inside a node all-gather on NVLink, the world's on the rail.
  PlanInput in = GpuInput(64, 3);
  in.shard_group = 8;
  absl::StatusOr<TimePlan> node = PlanTime(in);
  in.shard_group = 64;
  absl::StatusOr<TimePlan> world = PlanTime(in);
  ASSERT_TRUE(node.ok() && world.ok());
  EXPECT_LT(node->gather_s, world->gather_s);
}

TEST(PlanTime, NoPrefetchExposesEveryGather) {
  PlanInput in = GpuInput(64, 3);
  in.engine.prefetch_depth = 0;
  absl::StatusOr<TimePlan> t = PlanTime(in);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->exposed_comm_s, t->gather_s + t->reduce_s, 1e-9);
}

TEST(PlanTime, KeepingUnitsGatheredHalvesTheGathers) {
  PlanInput in = GpuInput(64, 3);
  absl::StatusOr<TimePlan> resharded = PlanTime(in);
  in.engine.reshard_after_forward = false;
  absl::StatusOr<TimePlan> kept = PlanTime(in);
  ASSERT_TRUE(resharded.ok() && kept.ok());
  EXPECT_NEAR(kept->gather_s * 2, resharded->gather_s, 1e-9);  // forward only, instead of forward and backward
}

TEST(PlanJson, HasTheDocumentedSchema) {
  absl::StatusOr<Plan> p = Evaluate(GpuInput(16, 3));
  ASSERT_TRUE(p.ok()) << p.status();
  const nlohmann::json j = nlohmann::json::parse(PlanJson(*p));
  for (const char* k : {"model", "cluster", "config", "memory", "time", "max_micro_batch"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"device_bytes", "pinned_host_bytes", "nvme_bytes", "engine", "activations_bytes",
                        "unit_copy_bytes", "host_resident_bytes", "items", "fits", "why_not"}) {
    EXPECT_TRUE(j["memory"].contains(k)) << k;
  }
  for (const char* k : {"step_ms", "compute_ms", "gather_ms", "reduce_ms", "exposed_comm_ms", "optimizer_ms", "io_ms",
                        "tokens_per_s", "mfu", "compute_efficiency", "link_efficiency"}) {
    EXPECT_TRUE(j["time"].contains(k)) << k;
  }
  EXPECT_EQ(j["cluster"]["shard_group_size"], 16);
  EXPECT_EQ(j["memory"]["device_bytes"].get<uint64_t>(), p->memory.tier[0]);
  uint64_t sum = 0;
  for (const auto& item : j["memory"]["items"]) sum += item["bytes"].get<uint64_t>();
  EXPECT_EQ(sum, p->memory.engine.tier[0] + p->memory.engine.tier[1] + p->memory.engine.tier[2]);
  const nlohmann::json s = nlohmann::json::parse(SearchJson({*p, *p}));
  EXPECT_EQ(s["candidates"].size(), 2u);
  EXPECT_EQ(j["memory"]["nvme_disk_bytes"], j["memory"]["nvme_bytes"]) << "no NVMe state: no room beside it";
  // With the optimizer state on NVMe, its files take it twice where the disk has the room (decision 0059), and the
  // text says so.
  absl::StatusOr<Plan> nvme = Evaluate(HostInput(Case{"nvme", 2, 3, DType::kF32, OffloadDevice::kNvme}));
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  const nlohmann::json n = nlohmann::json::parse(PlanJson(*nvme));
  uint64_t state = 0;
  for (const auto& item : n["memory"]["items"]) {
    if (item["what"] == "NVMe master and optimizer state") state = item["bytes"].get<uint64_t>();
  }
  ASSERT_GT(state, 0u);
  EXPECT_EQ(n["memory"]["nvme_disk_bytes"].get<uint64_t>(), n["memory"]["nvme_bytes"].get<uint64_t>() + state);
  EXPECT_THAT(PlanText(*nvme),
              ::testing::HasSubstr(absl::StrCat("NVMe disk per rank: ", FormatBytes(nvme->memory.tier[2] + state))));
}

TEST(PlanSearch, SeventyBillionOnAThousandRanksIsFastAndRanked) {
  PlanInput in = GpuInput(1024, 3);
  in.model = gpt::Spec(gpt::GptConfig{80, 8192, 64, 4096, 32000});
  in.checkpointing = true;
  in.engine.train_micro_batch_size_per_gpu = 1;
  in.engine.gradient_accumulation_steps = 4;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<Plan>> plans = Search(in);
  [[maybe_unused]] const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(plans.ok()) << plans.status();
#if defined(__OPTIMIZE__)  // the budget is the optimised build's (release); the asan preset is unoptimised
  EXPECT_LT(secs, 1.0);
#endif
  ASSERT_FALSE(plans->empty());
  for (size_t i = 1; i < plans->size(); ++i) {
    EXPECT_GE((*plans)[i - 1].time.tokens_per_s, (*plans)[i].time.tokens_per_s);
  }
  for (const Plan& p : *plans) {
    EXPECT_TRUE(p.memory.fits);
    EXPECT_EQ(p.in.engine.train_micro_batch_size_per_gpu * p.in.engine.gradient_accumulation_steps, 4);
  }
}

TEST(PlanSearch, NothingFitsIsAnErrorThatSaysWhy) {
  PlanInput in = GpuInput(8, 3);
  in.model = gpt::Spec(gpt::GptConfig{80, 8192, 64, 4096, 32000});
  absl::StatusOr<std::vector<Plan>> plans = Search(in);
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plans.status().message().find("tier 'device'"), std::string::npos) << plans.status();
}

absl::Status Parse(std::vector<std::string> args) { return ParsePlanArgs(args).status(); }

void ExpectError(std::vector<std::string> args, const std::string& words) {
  absl::Status s = Parse(args);
  if (s.ok()) {
    absl::StatusOr<PlanRequest> r = ParsePlanArgs(args);
    s = Evaluate(r->in).status();
  }
  EXPECT_FALSE(s.ok()) << words;
  EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
}

TEST(PlanOptions, BadInputGetsClearErrors) {
  ExpectError({"--ranks", "0"}, "--ranks");
  ExpectError({"--ranks", "8", "--shard-group-size", "3"}, "--shard-group-size 3 must divide --ranks 8");
  ExpectError({"--ranks", "8", "--ranks-per-node", "3"}, "--ranks-per-node 3");
  ExpectError({"--device-preset", "a100"}, "not a device preset");
  ExpectError({"--rank", "8"}, "--ranks");  // the nearest flag
  ExpectError({"--model", "gpt5"}, "unknown model 'gpt5'");
  ExpectError({"--stage", "7"}, "zero_optimization.stage");
  ExpectError({"--stage", "2", "--offload-params", "cpu"}, "needs stage 3 (stage is 2)");
  ExpectError({"--ranks", "2", "--stage", "0", "--shard-group-size", "1"}, "stage 0");
  ExpectError({"--stage", "1", "--offload-optimizer", "cpu"}, "needs ZeRO stage 2 or 3 (stage is 1)");
  ExpectError({"--device-preset", "host"}, "--matmul-gflops");
  ExpectError({"--device-preset", "host", "--matmul-gflops", "10", "--ranks", "2"}, "--allgather-gbps");
  ExpectError({"--matmul-gflops", "-3"}, "--matmul-gflops -3 must be > 0");
  ExpectError({"--compute-efficiency", "1.5"}, "--compute-efficiency 1.5");
  ExpectError({"--d-model", "30", "--heads", "4"}, "not a multiple of --heads");
}

TEST(PlanOptions, TrainFlagsMeanWhatTheyMeanToTrain) {
  absl::StatusOr<PlanRequest> r = ParsePlanArgs(
      {"--model", "gpt2", "--ranks", "16", "--ranks-per-node", "8", "--stage", "2", "--micro-batch", "3",
       "--grad-accum", "2", "--param-dtype", "bf16", "--shard-group-size=8", "--activation-checkpointing", "--json"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(gpt::ConfigOf(*r->in.model)->layers, 12);
  EXPECT_EQ(r->in.ranks, 16);
  EXPECT_EQ(r->in.shard_group, 8);
  EXPECT_EQ(r->in.engine.stage, 2);
  EXPECT_EQ(r->in.engine.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(r->in.engine.gradient_accumulation_steps, 2);
  EXPECT_EQ(r->in.engine.param_dtype, DType::kBF16);
  EXPECT_TRUE(r->in.checkpointing);
  EXPECT_TRUE(r->json);
  EXPECT_FALSE(r->search);
  EXPECT_EQ(r->in.device.name, "h200-sxm");
}

}  // namespace
}  // namespace strata::tools::plan
