#include "models/gpt/train/step_diagnostics.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::tools {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

StepTimes Step(double comm_ms, double cpu_share = 1.0) {
  StepTimes s;
  s.step_ms = 100;
  s.compute_ms = 100 - comm_ms;
  s.exposed_comm_ms = comm_ms;
  s.min_cpu_share = cpu_share;
  return s;
}

// Feeds `steps` copies of `s`; returns every line said.
std::vector<std::string> Feed(StepDiagnostics& d, const StepTimes& s, int steps) {
  std::vector<std::string> said;
  for (int i = 0; i < steps; ++i) {
    for (std::string& line : d.Observe(s)) said.push_back(std::move(line));
  }
  return said;
}

TEST(StepDiagnostics, APersistentBottleneckIsSaidOnceNotOncePerWindow) {
  StepDiagnostics d(DiagnosticThresholds{.window = 10});
  const auto said = Feed(d, Step(60), 2000);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_THAT(said[0], AllOf(HasSubstr("communication is exposed"), HasSubstr("60% of the time over the last 10 steps"),
                             HasSubstr("check the interconnect")));
}

TEST(StepDiagnostics, SaysAgainOnlyWhenTheVerdictChanges) {
  StepDiagnostics d(DiagnosticThresholds{.window = 10});
  EXPECT_THAT(Feed(d, Step(5), 50), IsEmpty());
  EXPECT_EQ(Feed(d, Step(60), 50).size(), 1u);
  // Just under the threshold is not yet cleared (3/4 of it is): no flapping around 30%.
  EXPECT_THAT(Feed(d, Step(28), 50), IsEmpty());
  const auto cleared = Feed(d, Step(5), 50);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_THAT(cleared[0], HasSubstr("diagnostic cleared: communication is exposed"));
  const auto again = Feed(d, Step(60), 50);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_THAT(again[0], HasSubstr("diagnostic: communication is exposed"));
}

TEST(StepDiagnostics, RanksOutnumberingCoresAreNamedInsteadOfTheInterconnect) {
  StepDiagnostics d(DiagnosticThresholds{.window = 10}, HostShare{.ranks = 4, .cores = 2});
  const auto said = Feed(d, Step(60), 100);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_THAT(said[0], AllOf(HasSubstr("not because of the interconnect"), HasSubstr("4 ranks share 2 cores"),
                             HasSubstr("mpirun -n 2"), Not(HasSubstr("check the interconnect"))));
  EXPECT_THAT(d.Summary(), HasSubstr("4 ranks on 2 cores"));
}

TEST(StepDiagnostics, DescheduledRanksAreNamedAndACauseChangeIsSaid) {
  StepDiagnostics d(DiagnosticThresholds{.window = 10}, HostShare{.ranks = 2, .cores = 2});
  const auto first = Feed(d, Step(60, 0.4), 100);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_THAT(first[0], AllOf(HasSubstr("descheduled"), HasSubstr("only 40% of a core"),
                              Not(HasSubstr("check the interconnect"))));
  // The other load goes away but the waits stay: now the transfers themselves are the cause.
  const auto second = Feed(d, Step(60, 1.0), 100);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_THAT(second[0], HasSubstr("check the interconnect"));
}

// Two ranks on two shared cores hover near the descheduled threshold: the cause must not flip every window
// (an adversarial run saw 83 lines in 9000 steps).
TEST(StepDiagnostics, ACpuShareHoveringAtTheThresholdDoesNotFlipTheCause) {
  StepDiagnostics d(DiagnosticThresholds{.window = 10}, HostShare{.ranks = 2, .cores = 2});
  std::vector<std::string> said;
  for (int i = 0; i < 9000; ++i) {
    for (std::string& line : d.Observe(Step(60, (i / 20) % 2 == 0 ? 0.70 : 0.80))) said.push_back(std::move(line));
  }
  ASSERT_EQ(said.size(), 1u) << said.back();
  EXPECT_THAT(said[0], HasSubstr("descheduled"));
}

TEST(StepDiagnostics, EachConditionIsJudgedOnItsOwn) {
  StepDiagnostics d(DiagnosticThresholds{.window = 5});
  StepTimes s = Step(60);
  s.data_wait_ms = 20;
  s.exposed_io_ms = 40;
  const auto said = Feed(d, s, 100);
  EXPECT_THAT(said, ElementsAre(HasSubstr("data loading is the bottleneck"), HasSubstr("communication is exposed"),
                                HasSubstr("offload I/O is exposed")));
}

TEST(StepDiagnostics, SummaryIsWhereTheTimeWentOverTheWholeRun) {
  StepDiagnostics d(DiagnosticThresholds{.window = 5});
  EXPECT_EQ(d.Summary(), "");
  StepTimes s;
  s.step_ms = 200;
  s.compute_ms = 100;
  s.exposed_comm_ms = 50;
  s.optimizer_ms = 20;
  s.data_wait_ms = 10;
  Feed(d, s, 3);
  s.step_ms = 100;  // a second phase: the mean is over every step
  s.compute_ms = 100;
  s.exposed_comm_ms = s.optimizer_ms = s.data_wait_ms = 0;
  Feed(d, s, 1);
  // totals: step 700, compute 400, comm 150, optimizer 60, data 30, other 60
  EXPECT_EQ(d.Summary(),
            "step time (mean 175.0 ms over 4 steps): compute 57% | exposed communication 21% | exposed I/O 0% | "
            "optimizer 9% | data wait 4% | other 9%");
}

HostRecord On(uint64_t host, std::vector<int> cpus) {
  HostRecord r;
  r.host = host;
  for (int c : cpus) r.cpus[c / 64] |= uint64_t{1} << (c % 64);
  return r;
}

TEST(CrowdedHost, CountsRanksPerHostAgainstTheUnionOfTheirCores) {
  // Host 1: four ranks free to run on cores 0-1. Host 2: two ranks, each bound to its own core.
  const HostShare h = CrowdedHost({On(1, {0, 1}), On(1, {0, 1}), On(2, {0}), On(1, {0, 1}), On(2, {1}), On(1, {0, 1})});
  EXPECT_EQ(h.ranks, 4);
  EXPECT_EQ(h.cores, 2);
  // Bound to distinct cores, ranks == cores: not oversubscribed, whatever each mask alone says.
  const HostShare bound = CrowdedHost({On(2, {0}), On(2, {1})});
  EXPECT_EQ(bound.ranks, 2);
  EXPECT_EQ(bound.cores, 2);
  const HostShare wide = CrowdedHost({On(3, {100, 1000})});
  EXPECT_EQ(wide.cores, 2);
}

TEST(CrowdedHost, ThisHostSeesAtLeastOneCore) {
  const HostShare h = CrowdedHost({ThisHost()});
  EXPECT_EQ(h.ranks, 1);
  EXPECT_GE(h.cores, 1);
}

}  // namespace
}  // namespace strata::tools
