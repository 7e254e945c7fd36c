// Tests for runtime/comm/mpi_communicator: the conformance suite on the real MPI world communicator.
// Run as `scripts/mpirun_local -n N comm_mpi_test` (ctest does so for N = 1..4).
//
// This binary has its own main() (tests/runtime/mpi_gtest_main.h): MPI is initialised once per process.
// Killing ranks and the timeout path are covered by the integration tests, not here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"
#include "tests/runtime/mpi_gtest_main.h"

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

}  // namespace
}  // namespace strata::comm

int main(int argc, char** argv) {
  return strata::testing::RunMpiTests(argc, argv, "comm_mpi_test", &strata::comm::g_runtime);
}
