// `strata plan` takes any model that implements the model interface (spec/model_spec.h), not only the GPT:
// a second family, the example MLP (models/mlp/mlp_spec.h), is registered here beside the GPT (which
// registers itself, strata_gpt_register) and planned through the same calls `strata plan` makes
// (ParsePlanArgs with --model-family mlp, Evaluate, PlanJson / PlanText). Its plan's bytes per tier equal
// the engine's MemoryTracker peaks after two steps of the MLP itself on the engine, for every stage, dtype
// and offload; its step time follows its own schedule of unit uses (ModelSpec::Uses); and the registry
// keeps the families' flags apart.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/spec/gpt_spec.h"
#include "models/mlp/mlp_spec.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "spec/registry.h"
#include "tests/runtime/engine/rank_harness.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_options.h"
#include "tools/plan/plan_units.h"

namespace strata::tools::plan {
namespace {

using ::testing::HasSubstr;

const spec::Registration kMlp(mlp::MakeMlpFamily(), /*is_default=*/false);

struct Case {
  const char* name;
  int ranks;
  int stage;
  const char* dtype;
  const char* optimizer = "none";
  const char* params = "none";
};

// The plan's command line for the MLP: its shape and the engine's flags, on the measured host preset's flags.
std::vector<std::string> Args(const Case& c, const std::string& nvme_dir) {
  std::vector<std::string> a = {"--model-family",
                                "mlp",
                                "--in",
                                "12",
                                "--hidden",
                                "40",
                                "--out",
                                "3",
                                "--stage",
                                absl::StrCat(c.stage),
                                "--param-dtype",
                                c.dtype,
                                "--micro-batch",
                                "3",
                                "--grad-accum",
                                "2",
                                "--ranks",
                                absl::StrCat(c.ranks),
                                "--ranks-per-node",
                                absl::StrCat(c.ranks),
                                "--device-preset",
                                "host",
                                "--matmul-gflops",
                                "10",
                                "--allgather-gbps",
                                "1",
                                "--reduce-scatter-gbps",
                                "1",
                                "--allreduce-gbps",
                                "1",
                                "--update-gbps",
                                "10",
                                "--offload-optimizer",
                                c.optimizer,
                                "--offload-params",
                                c.params,
                                "--nvme-path",
                                nvme_dir};
  return a;
}

// Two steps of the MLP on the engine, brought up by its family as `strata bench` would: rank 0's peaks.
absl::StatusOr<std::vector<uint64_t>> RunSteps(const PlanInput& in) {
  STRATA_ASSIGN_OR_RETURN(const spec::Family* family, spec::FindFamily("mlp"));
  std::vector<uint64_t> peaks(3, 0);
  auto results = testing::RunRanks(in.ranks, comm::Options{}, [&](int rank, comm::Communicator& world) -> absl::Status {
    device::HostDevice dev;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<spec::Trainer> run,
                            family->BringUp(*in.model, in.engine, world, dev, nullptr));
    run->SynthesizeTokens(1 + rank, in.engine.train_micro_batch_size_per_gpu);
    for (int step = 0; step < 2; ++step) {
      STRATA_RETURN_IF_ERROR(run->RunMicroBatches(in.engine.gradient_accumulation_steps, false).status());
      STRATA_RETURN_IF_ERROR(run->engine().Step().status());
    }
    if (rank == 0) {
      const engine::MemoryStats m = run->engine().memory_stats();
      for (int t = 0; t < 3; ++t) peaks[t] = m.tier[t].peak_bytes;
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) STRATA_RETURN_IF_ERROR(s);
  return peaks;
}

class MlpPlanMatchesEngine : public ::testing::TestWithParam<Case> {};

TEST_P(MlpPlanMatchesEngine, PeakBytesPerTierAreExact) {
  const Case& c = GetParam();
  const std::string dir = absl::StrCat(::testing::TempDir(), "/plan_any_model_", c.name);
  std::filesystem::create_directories(dir);
  absl::StatusOr<PlanRequest> r = ParsePlanArgs(Args(c, dir));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->in.model->Describe(), "in 12, hidden 40, out 3");
  absl::StatusOr<Plan> p = Evaluate(r->in);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<std::vector<uint64_t>> peaks = RunSteps(r->in);
  ASSERT_TRUE(peaks.ok()) << peaks.status();
  const char* tiers[] = {"device", "pinned_host", "nvme"};
  for (int t = 0; t < 3; ++t) EXPECT_EQ(p->memory.engine.tier[t], (*peaks)[t]) << c.name << ": tier " << tiers[t];
  EXPECT_GT(p->memory.engine.tier[0] + p->memory.engine.tier[1] + p->memory.engine.tier[2], 0u);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Configs, MlpPlanMatchesEngine,
                         ::testing::Values(Case{"stage0_fp32", 2, 0, "fp32"}, Case{"stage1_fp32", 2, 1, "fp32"},
                                           Case{"stage2_bf16", 2, 2, "bf16"}, Case{"stage3_fp32", 3, 3, "fp32"},
                                           Case{"stage2_cpu_optimizer", 2, 2, "fp32", "cpu"},
                                           Case{"stage3_cpu_both", 2, 3, "bf16", "cpu", "cpu"},
                                           Case{"stage3_nvme_optimizer", 2, 3, "fp32", "nvme"},
                                           Case{"stage3_nvme_params", 2, 3, "bf16", "cpu", "nvme"},
                                           Case{"stage1_single_rank", 1, 1, "bf16"}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

PlanInput MlpInput(int ranks, int stage) {
  absl::StatusOr<PlanRequest> r = ParsePlanArgs(Args(Case{"t", ranks, stage, "fp32"}, "/tmp"));
  EXPECT_TRUE(r.ok()) << r.status();
  return r->in;
}

TEST(MlpPlanTime, ComputeAndGathersFollowTheModelsOwnUses) {
  PlanInput in = MlpInput(2, 3);
  absl::StatusOr<TimePlan> t = PlanTime(in);
  ASSERT_TRUE(t.ok()) << t.status();
  // 3 x forward FLOPs (forward + backward) of 2 micro-batches of 3 samples, at 10 GFLOP/s (efficiency 1).
  const double flops = 3 * in.model->ForwardFlopsPerToken() * 3 * 2;
  EXPECT_NEAR(t->compute_s, flops / 10e9, 1e-9 * t->compute_s);
  // Stage 3 gathers every use, forward (input, hidden, hidden, output) and backward again: 8 gathers of the
  // units' fp32 layouts per micro-batch.
  absl::StatusOr<std::vector<shard::UnitLayout>> layouts = Layouts(in);
  ASSERT_TRUE(layouts.ok());
  ASSERT_EQ(layouts->size(), 3u);
  double one_pass = 0;
  for (int u : {0, 1, 1, 2}) one_pass += AllGatherSeconds((*layouts)[u].total_elems * 4, 2, in.device.intra);
  EXPECT_NEAR(t->gather_s, 2 * 2 * one_pass, 1e-12);
}

TEST(MlpPlanOutput, NamesTheModelsOwnDimensions) {
  absl::StatusOr<Plan> p = Evaluate(MlpInput(2, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  const nlohmann::json j = nlohmann::json::parse(PlanJson(*p));
  EXPECT_EQ(
      j["model"],
      (nlohmann::json{{"in", 12}, {"hidden", 40}, {"out", 3}, {"params", 12 * 40 + 40 + 40 * 40 + 40 + 40 * 3 + 3}}));
  EXPECT_THAT(PlanText(*p), HasSubstr("in 12, hidden 40, out 3 ("));
}

// A model whose schedule names a unit it does not have: the plan says so instead of reading past its units.
class BadSchedule final : public spec::ModelSpec {
 public:
  explicit BadSchedule(std::shared_ptr<const spec::ModelSpec> m) : m_(std::move(m)) {}
  absl::Status Validate() const override { return m_->Validate(); }
  std::string Describe() const override { return m_->Describe(); }
  std::string Shape() const override { return m_->Shape(); }
  std::vector<spec::Dimension> Dimensions() const override { return m_->Dimensions(); }
  int64_t NumParams() const override { return m_->NumParams(); }
  int SequenceLength() const override { return m_->SequenceLength(); }
  std::vector<spec::UnitSpec> Units() const override { return m_->Units(); }
  uint64_t ActivationBytes(int b, bool c, const spec::ComputeTarget& t) const override {
    return m_->ActivationBytes(b, c, t);
  }
  uint64_t UnitCopyBytes(DType d, size_t n) const override { return m_->UnitCopyBytes(d, n); }
  double ForwardFlopsPerToken() const override { return m_->ForwardFlopsPerToken(); }
  spec::StepUses Uses(int b) const override {
    spec::StepUses u = m_->Uses(b);
    u.backward.back().unit = 3;  // the MLP has units 0-2
    return u;
  }
  spec::Product HostProduct(int b) const override { return m_->HostProduct(b); }
  double HostProductGflops(const spec::Product& p, double s) const override { return m_->HostProductGflops(p, s); }
  spec::Growth Grows(bool w) const override { return m_->Grows(w); }
  std::shared_ptr<const spec::ModelSpec> Scaled(bool w, int64_t k) const override { return m_->Scaled(w, k); }

 private:
  std::shared_ptr<const spec::ModelSpec> m_;
};

TEST(MlpPlanTime, AScheduleNamingAMissingUnitIsRefused) {
  PlanInput in = MlpInput(2, 3);
  ASSERT_TRUE(PlanTime(in).ok());
  in.model = std::make_shared<BadSchedule>(in.model);
  absl::StatusOr<Plan> p = Evaluate(in);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("names unit 3; it has 3"));
  EXPECT_THAT(Evaluate(PlanInput{}).status().message(), HasSubstr("no model to plan"));
}

TEST(ModelFamilies, FlagsBelongToTheFamilyChosen) {
  // Without --model-family the default family (the GPT) reads the flags; the MLP's are unknown to it.
  EXPECT_THAT(ParsePlanArgs({"--hidden", "8"}).status().message(), HasSubstr("unknown flag --hidden"));
  EXPECT_TRUE(ParsePlanArgs({"--model", "gpt2"}).ok());
  EXPECT_THAT(ParsePlanArgs({"--model-family", "mlp", "--model", "gpt2"}).status().message(),
              HasSubstr("unknown flag --model"));
  const absl::Status unknown = ParsePlanArgs({"--model-family", "llama"}).status();
  EXPECT_THAT(unknown.message(), HasSubstr("--model-family 'llama': unknown"));
  EXPECT_THAT(unknown.message(), HasSubstr("gpt"));
  EXPECT_THAT(unknown.message(), HasSubstr("mlp"));
  EXPECT_THAT(ParsePlanArgs({"--model-family"}).status().message(), HasSubstr("--model-family needs a value"));
}

TEST(ModelFamilies, AFamilyBringsUpOnlyItsOwnModels) {
  absl::StatusOr<const spec::Family*> mlp = spec::FindFamily("mlp");
  ASSERT_TRUE(mlp.ok());
  auto results = testing::RunRanks(1, comm::Options{}, [&](int, comm::Communicator& world) -> absl::Status {
    device::HostDevice dev;
    return (*mlp)->BringUp(*gpt::Spec(gpt::GptConfig{}), engine::EngineConfig{}, world, dev, nullptr).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("MLPs only"));
}

}  // namespace
}  // namespace strata::tools::plan
