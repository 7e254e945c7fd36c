// Tests for runtime/comm/mpi_communicator: the conformance suite on the real MPI world communicator.
// Run as `scripts/mpirun_local -n N comm_mpi_test` (ctest does so for N = 1..4).
//
// This binary has its own main(): MPI is initialised once per process (MpiRuntime) before any test and
// finalised after all of them. Every rank runs the same tests in the same order. Rank 0 prints the
// usual GoogleTest output; other ranks print only their failures, prefixed with their rank. The exit
// code is the maximum over ranks, so a failure on any rank fails every process and thus mpirun.
// Killing ranks and the timeout path are covered by the integration tests, not here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::comm {
namespace {

// Set by main() for the duration of RUN_ALL_TESTS: the process-wide MPI state that tests ask for
// communicators. (A test binary's main is the one place such context can come from.)
MpiRuntime* g_runtime = nullptr;

class MpiConformance : public ::testing::TestWithParam<size_t> {};

TEST_P(MpiConformance, Passes) {
  ASSERT_NE(g_runtime, nullptr);
  Options options;
  options.timeout_ms = 30000;  // a hang becomes a failure naming the collective well before ctest's limit
  options.name = "world";
  auto comm = g_runtime->World(options);  // collective over MPI_COMM_WORLD; fails on every rank or none
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->rank(), g_runtime->world_rank());
  EXPECT_EQ((*comm)->size(), g_runtime->world_size());
  device::HostDevice dev;
  auto stream = dev.CreateStream("world");
  ASSERT_TRUE(stream.ok()) << stream.status();
  conformance::RankHarness h{**comm, dev, **stream};
  conformance::Cases()[GetParam()].body(h);
  const absl::Status st = (*stream)->Synchronize();  // drain before the communicator is freed
  EXPECT_TRUE(st.ok()) << "rank " << g_runtime->world_rank() << ": " << st;
  stream->reset();
}

INSTANTIATE_TEST_SUITE_P(AllCases, MpiConformance, ::testing::Range(size_t{0}, conformance::Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return conformance::Cases()[info.param].name;
                         });

// Prints the failures of a rank whose normal output is suppressed, prefixed with its rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test is remembered here: UnitTest::current_test_info() would take the lock GoogleTest holds
  // while it calls OnTestPartResult.
  void OnTestStart(const ::testing::TestInfo& test) override { test_ = &test; }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = nullptr; }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s.%s: %s:%d: Failure\n%s\n", rank_, test_ ? test_->test_suite_name() : "?",
                 test_ ? test_->name() : "?", result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
    std::fflush(stderr);
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    if (unit.failed_test_count() > 0) {
      std::fprintf(stderr, "[rank %d] %d test(s) failed on this rank\n", rank_, unit.failed_test_count());
    }
  }

 private:
  const int rank_;
  const ::testing::TestInfo* test_ = nullptr;
};

}  // namespace
}  // namespace strata::comm

int main(int argc, char** argv) {
  auto runtime = strata::comm::MpiRuntime::Init(&argc, &argv);
  if (!runtime.ok()) {
    std::fprintf(stderr, "comm_mpi_test: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = (*runtime)->world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new strata::comm::RankFailurePrinter(rank));
  }
  strata::comm::g_runtime = runtime->get();
  const int local = RUN_ALL_TESTS();
  strata::comm::g_runtime = nullptr;
  // Raw MPI on purpose: the verdict must not depend on the communicator under test.
  int global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && local == 0 && global != 0) {
    std::fprintf(stderr, "comm_mpi_test: another rank failed; see its [rank N] lines above\n");
  }
  runtime->reset();  // MPI_Finalize
  return global;
}
