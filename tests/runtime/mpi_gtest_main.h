// The main() of GoogleTest binaries that run under mpirun (one per process): MPI is initialised once
// (MpiRuntime) before any test and finalised after all of them; every rank runs the same tests in the
// same order. Rank 0 prints the usual GoogleTest output; other ranks print only their failures,
// prefixed with their rank. The exit code is the maximum over ranks, so a failure on any rank fails
// every process and thus mpirun.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "runtime/comm/mpi_communicator.h"

namespace strata::testing {

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

// Runs every test with *runtime_slot set to the process's MpiRuntime (a test binary's main is the one
// place such context can come from) and returns the verdict of all ranks.
inline int RunMpiTests(int argc, char** argv, const char* binary, comm::MpiRuntime** runtime_slot) {
  auto runtime = comm::MpiRuntime::Init(&argc, &argv);
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s: %s\n", binary, runtime.status().ToString().c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = (*runtime)->world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  *runtime_slot = runtime->get();
  const int local = RUN_ALL_TESTS();
  *runtime_slot = nullptr;
  // Raw MPI on purpose: the verdict must not depend on the communicator under test.
  int global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && local == 0 && global != 0) {
    std::fprintf(stderr, "%s: another rank failed; see its [rank N] lines above\n", binary);
  }
  runtime->reset();  // MPI_Finalize
  return global;
}

}  // namespace strata::testing
