// Each model family the `strata` executable registers (the GPT and the MLP) against its own trainer:
//   - its schedule (ModelSpec::Uses, which `strata plan` times) is the order its trainer calls the engine's
//     hooks in, as the engine's timeline records them on the first step (spec::CheckUses, which `strata
//     bench step` runs on its warm-up step; docs/decisions/0002-schedule-recording-and-eval.md);
//   - its ActivationBytes (which `strata plan` adds to the host or device tier) equals the bytes its
//     trainer's workspace held (Trainer::activation_bytes): for the MLP the peak its allocator counted, over
//     shapes whose peak falls in different uses (the second hidden backward, the input's, the output's).
// Over stages, dtypes, ranks, accumulation and activation checkpointing. Then CheckUses refuses a schedule
// that differs from the trainer's, naming the first use that differs.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"
#include "spec/registry.h"
#include "tests/runtime/engine/rank_harness.h"

namespace strata::spec {
namespace {

using ::testing::HasSubstr;

struct Case {
  const char* name;
  const char* family;
  int ranks;
  std::vector<std::string> flags;
};

struct Ran {
  std::vector<device::Span> spans;  // rank 0's timeline of the first step
  uint64_t activation_bytes = 0;    // rank 0's trainer's, after two steps
};

absl::StatusOr<std::unique_ptr<TrainSetup>> ParseCase(const Case& c) {
  STRATA_ASSIGN_OR_RETURN(const Family* f, FindFamily(c.family));
  return f->ParseTrain(c.flags, c.ranks);
}

// Two steps of the family's trainer over in-process ranks, as `strata bench` runs it.
absl::StatusOr<Ran> RunSteps(const Case& c, const TrainSetup& s) {
  STRATA_ASSIGN_OR_RETURN(const Family* f, FindFamily(c.family));
  Ran out;
  const std::vector<absl::Status> results =
      testing::RunRanks(c.ranks, comm::Options{}, [&](int rank, comm::Communicator& world) -> absl::Status {
        device::HostDevice dev;
        STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, f->BringUp(*s.model, s.engine, world, dev, nullptr));
        t->SynthesizeTokens(1 + rank, s.engine.train_micro_batch_size_per_gpu);
        t->engine().timeline().SetEnabled(true);
        for (int step = 0; step < 2; ++step) {
          STRATA_RETURN_IF_ERROR(t->RunMicroBatches(s.engine.gradient_accumulation_steps, s.checkpointing).status());
          STRATA_RETURN_IF_ERROR(t->engine().Step().status());
          t->engine().timeline().SetEnabled(false);
        }
        if (rank == 0) {
          out.spans = t->engine().timeline().Take();
          out.activation_bytes = t->activation_bytes();
        }
        return absl::OkStatus();
      });
  for (const absl::Status& r : results) STRATA_RETURN_IF_ERROR(r);
  return out;
}

class FamilyMatchesItsTrainer : public ::testing::TestWithParam<Case> {};

TEST_P(FamilyMatchesItsTrainer, ScheduleAndActivationBytes) {
  const Case& c = GetParam();
  absl::StatusOr<std::unique_ptr<TrainSetup>> s = ParseCase(c);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<Ran> ran = RunSteps(c, **s);
  ASSERT_TRUE(ran.ok()) << ran.status();
  const engine::EngineConfig& e = (*s)->engine;
  const int B = e.train_micro_batch_size_per_gpu;
  const StepUses uses = (*s)->model->Uses(B);
  size_t compute = 0;
  for (const device::Span& sp : ran->spans) compute += sp.stream == "compute";
  EXPECT_EQ(compute, (uses.forward.size() + uses.backward.size()) * e.gradient_accumulation_steps) << c.name;
  EXPECT_TRUE(CheckUses(*(*s)->model, B, ran->spans).ok()) << CheckUses(*(*s)->model, B, ran->spans);
  EXPECT_EQ(ran->activation_bytes,
            (*s)->model->ActivationBytes(B, (*s)->checkpointing, ComputeTarget{false, e.param_dtype}))
      << c.name << ": " << (*s)->model->Describe();
  EXPECT_GT(ran->activation_bytes, 0u);
}

const std::vector<std::string> kSmallGpt = {"--device", "host", "--layers",  "2",  "--d-model", "32",
                                            "--heads",  "2",    "--seq-len", "16", "--vocab",   "64"};
std::vector<std::string> Gpt(std::vector<std::string> more) {
  more.insert(more.begin(), kSmallGpt.begin(), kSmallGpt.end());
  return more;
}

INSTANTIATE_TEST_SUITE_P(
    Families, FamilyMatchesItsTrainer,
    ::testing::Values(
        Case{"gpt_stage3", "gpt", 2, Gpt({"--micro-batch", "2"})},
        Case{"gpt_stage2_bf16_ckpt_accum2", "gpt", 1,
             Gpt({"--micro-batch", "3", "--stage", "2", "--param-dtype", "bf16", "--activation-checkpointing",
                  "--grad-accum", "2"})},
        // The MLP's peak: the second hidden backward use (the default shape), the input's
        // backward (in > hidden), the output's backward (out > 3 B + hidden).
        Case{"mlp_stage3", "mlp", 2, {"--micro-batch", "3"}},
        Case{"mlp_wide_input_stage1_accum2",
             "mlp",
             3,
             {"--in", "64", "--hidden", "8", "--out", "4", "--micro-batch", "2", "--stage", "1", "--grad-accum", "2"}},
        Case{"mlp_wide_output_stage2_bf16",
             "mlp",
             2,
             {"--in", "4", "--hidden", "8", "--out", "64", "--micro-batch", "1", "--stage", "2", "--param-dtype",
              "bf16"}},
        Case{"mlp_stage0", "mlp", 1, {"--hidden", "40", "--micro-batch", "5", "--stage", "0"}},
        Case{"mlp_stage3_cpu_offload",
             "mlp",
             2,
             {"--hidden", "24", "--micro-batch", "2", "--offload-optimizer", "cpu", "--offload-params", "cpu"}}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A model's spec with its schedule edited: what a family whose spec disagrees with its trainer would give.
class EditedUses final : public ModelSpec {
 public:
  EditedUses(std::shared_ptr<const ModelSpec> m, std::function<void(StepUses&)> edit)
      : m_(std::move(m)), edit_(std::move(edit)) {}
  absl::Status Validate() const override { return m_->Validate(); }
  std::string Describe() const override { return m_->Describe(); }
  std::string Shape() const override { return m_->Shape(); }
  std::vector<Dimension> Dimensions() const override { return m_->Dimensions(); }
  int64_t NumParams() const override { return m_->NumParams(); }
  int SequenceLength() const override { return m_->SequenceLength(); }
  std::vector<UnitSpec> Units() const override { return m_->Units(); }
  uint64_t ActivationBytes(int b, bool c, const ComputeTarget& t) const override {
    return m_->ActivationBytes(b, c, t);
  }
  uint64_t UnitCopyBytes(DType d, size_t n) const override { return m_->UnitCopyBytes(d, n); }
  double ForwardFlopsPerToken() const override { return m_->ForwardFlopsPerToken(); }
  StepUses Uses(int b) const override {
    StepUses u = m_->Uses(b);
    edit_(u);
    return u;
  }
  Product HostProduct(int b) const override { return m_->HostProduct(b); }
  double HostProductGflops(const Product& p, double s) const override { return m_->HostProductGflops(p, s); }
  Growth Grows(bool w) const override { return m_->Grows(w); }
  std::shared_ptr<const ModelSpec> Scaled(bool w, int64_t k) const override { return m_->Scaled(w, k); }

 private:
  std::shared_ptr<const ModelSpec> m_;
  std::function<void(StepUses&)> edit_;
};

TEST(CheckUses, RefusesAScheduleThatDiffersFromTheTrainersNamingTheUse) {
  const Case c{"mlp", "mlp", 1, {"--micro-batch", "2", "--grad-accum", "2"}};
  absl::StatusOr<std::unique_ptr<TrainSetup>> s = ParseCase(c);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<Ran> ran = RunSteps(c, **s);
  ASSERT_TRUE(ran.ok()) << ran.status();
  const std::shared_ptr<const ModelSpec> mlp = (*s)->model;
  ASSERT_TRUE(CheckUses(*mlp, 2, ran->spans).ok());

  // The hidden unit used once in forward: the third use is the output in the schedule.
  const EditedUses once(mlp, [](StepUses& u) { u.forward.erase(u.forward.begin() + 2); });
  EXPECT_THAT(CheckUses(once, 2, ran->spans).message(),
              HasSubstr("use 3 of micro-batch 1 is forward of unit 2 'output' in the schedule, but the trainer "
                        "called forward of unit 1 'hidden'"));
  // Backward in forward's order.
  const EditedUses reversed(mlp, [](StepUses& u) {
    std::reverse(u.backward.begin(), u.backward.end());
    for (UnitUse& b : u.backward) b.reduces = b.unit != 1 || &b == &u.backward[2];
  });
  EXPECT_THAT(CheckUses(reversed, 2, ran->spans).message(),
              HasSubstr("use 5 of micro-batch 1 is backward of unit 0 'input' in the schedule, but the trainer "
                        "called backward of unit 2 'output'"));
  // The hidden unit's gradient said complete after its first backward use.
  const EditedUses early(mlp, [](StepUses& u) { u.backward[1].reduces = true; });
  EXPECT_THAT(CheckUses(early, 2, ran->spans).message(),
              HasSubstr("marks backward use 2 (backward of unit 1 'hidden') as the one its gradient is complete "
                        "after, but it is not the unit's last backward use"));
  const EditedUses never(mlp, [](StepUses& u) { u.backward[2].reduces = false; });
  EXPECT_THAT(CheckUses(never, 2, ran->spans).message(),
              HasSubstr("marks backward use 3 (backward of unit 1 'hidden') as not the one its gradient is complete "
                        "after, but it is the unit's last backward use"));
  // An extra use at the end: the second micro-batch's first use is compared with it.
  const EditedUses extra(mlp, [](StepUses& u) {
    u.backward.back().reduces = false;
    u.backward.push_back({0, 0, false, true});
  });
  EXPECT_THAT(CheckUses(extra, 2, ran->spans).message(),
              HasSubstr("use 9 of micro-batch 1 is backward of unit 0 'input' in the schedule, but the trainer called "
                        "forward of unit 0 'input'"));
  // A unit the model does not have.
  const EditedUses ghost(mlp, [](StepUses& u) { u.forward[0].unit = 7; });
  EXPECT_THAT(CheckUses(ghost, 2, ran->spans).message(), HasSubstr("forward of unit 7 (no such unit) in the schedule"));

  // The trainer's record cut in the middle of a micro-batch, or empty.
  std::vector<device::Span> cut;
  for (const device::Span& sp : ran->spans) {
    if (sp.stream == "compute") cut.push_back(sp);
  }
  ASSERT_EQ(cut.size(), 16u);  // 2 micro-batches of 4 forward and 4 backward uses
  cut.pop_back();
  EXPECT_THAT(
      CheckUses(*mlp, 2, cut).message(),
      HasSubstr("the schedule has 8 uses a micro-batch, the trainer ended after 7 of micro-batch 2 (15 in all)"));
  EXPECT_THAT(CheckUses(*mlp, 2, {}).message(), HasSubstr("no uses to compare: the model's schedule has 8, the "
                                                          "trainer called 0"));

  // Another family's schedule: the GPT's against the MLP's trainer.
  absl::StatusOr<std::unique_ptr<TrainSetup>> gpt = ParseCase(Case{"gpt", "gpt", 1, Gpt({"--micro-batch", "2"})});
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_THAT(CheckUses(*(*gpt)->model, 2, ran->spans).message(),
              HasSubstr("differs from the hooks its trainer called: use 3 of micro-batch 1 is forward of unit 2 "
                        "'h.1' in the schedule, but the trainer called forward of unit 1"));
}

}  // namespace
}  // namespace strata::spec
