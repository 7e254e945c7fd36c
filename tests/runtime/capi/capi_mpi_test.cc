// The C ABI over an MPI the host owns: the host initialises MPI itself (as an embedding trainer does),
// then Strata adopts MPI_COMM_WORLD (strata_comm_create_mpi_world) and a host sub-communicator passed
// by its Fortran handle (strata_comm_create_mpi). The adopted communicator passes the Communicator
// conformance suite, on a communicator whose rank order is the reverse of the world's.
// Run as `scripts/mpirun_local -n N capi_mpi_test`; like comm_mpi_test, only rank 0 prints the usual
// output and the exit code is the maximum over ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/capi/mpi_adopt.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/capi/capi_test_util.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::capi_test {
namespace {

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The host's own communicator: MPI_COMM_WORLD with the rank order reversed.
MPI_Comm Reversed() {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, WorldSize() - 1 - WorldRank(), &c);
  return c;
}

TEST(CApiMpi, AdoptsTheHostsWorld) {
  strata_comm* comm = nullptr;
  ASSERT_STRATA_OK(strata_comm_create_mpi_world(&comm));
  int32_t rank = -1, size = -1;
  EXPECT_STRATA_OK(strata_comm_rank(comm, &rank));
  EXPECT_STRATA_OK(strata_comm_size(comm, &size));
  EXPECT_EQ(rank, WorldRank());
  EXPECT_EQ(size, WorldSize());
  EXPECT_STRATA_OK(strata_comm_destroy(comm));
}

TEST(CApiMpi, AdoptsAHostCommunicatorByItsFortranHandle) {
  MPI_Comm host = Reversed();
  strata_comm* comm = nullptr;
  ASSERT_STRATA_OK(strata_comm_create_mpi(static_cast<int32_t>(MPI_Comm_c2f(host)), &comm));
  MPI_Comm_free(&host);  // Strata holds its own duplicate
  int32_t rank = -1;
  EXPECT_STRATA_OK(strata_comm_rank(comm, &rank));
  EXPECT_EQ(rank, WorldSize() - 1 - WorldRank());
  // An engine on it trains: one step of the test model, then every rank holds the same parameters.
  strata_engine* e = nullptr;
  ASSERT_STRATA_OK(MakeEngine(comm, "{\"zero_optimization\": {\"stage\": 3}}", true, &e));
  ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
  for (int u = 0; u < 2; ++u) {
    ASSERT_STRATA_OK(strata_engine_begin_forward(e, u, nullptr));
    ASSERT_STRATA_OK(strata_engine_end_forward(e, u));
  }
  for (int u = 1; u >= 0; --u) {
    float* g = nullptr;
    ASSERT_STRATA_OK(strata_engine_begin_backward(e, u, nullptr));
    ASSERT_STRATA_OK(strata_engine_grad(e, u, 1, &g));
    g[0] += 1.0f + static_cast<float>(rank);
    ASSERT_STRATA_OK(strata_engine_end_backward(e, u));
  }
  ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
  strata_step_result r = STRATA_STEP_RESULT_INIT;
  ASSERT_STRATA_OK(strata_engine_step(e, &r));
  EXPECT_EQ(r.step, 1);
  float bias[8];
  ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 1, bias, 8));
  float first = bias[0];
  MPI_Bcast(&first, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(bias[0], first) << "world rank " << WorldRank();
  EXPECT_LT(bias[0], 0.0f) << "a positive gradient moved the zero-initialised bias down";
  EXPECT_STRATA_OK(strata_engine_destroy(e));
  EXPECT_STRATA_OK(strata_comm_destroy(comm));
}

// One micro-batch of the test model: forward of `order`, backward in reverse; returns the first failure.
strata_status MicroBatch(strata_engine* e, const std::vector<int>& order) {
  strata_status s = strata_engine_begin_micro_batch(e);
  for (size_t i = 0; s == STRATA_OK && i < order.size(); ++i) {
    s = strata_engine_begin_forward(e, order[i], nullptr);
    if (s == STRATA_OK) s = strata_engine_end_forward(e, order[i]);
  }
  for (size_t i = order.size(); s == STRATA_OK && i-- > 0;) {
    s = strata_engine_begin_backward(e, order[i], nullptr);
    if (s == STRATA_OK) s = strata_engine_end_backward(e, order[i]);
  }
  return s == STRATA_OK ? strata_engine_end_micro_batch(e) : s;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Note [Agreed schedule] through the C ABI over MPI, with a collective timeout of a minute: a planted
// divergence fails every rank within 5 s. In the first micro-batch (the last rank runs unit b where the
// others run a) every rank gets the same FAILED_PRECONDITION naming both; after the record (the last
// rank skips unit a) it fails on its own check and every other rank gets PEER_FAILED naming it.
TEST(CApiMpi, APlantedDivergenceFailsEveryRankWithinSeconds) {
  const int rank = WorldRank(), last = WorldSize() - 1;
  const char* json = "{\"zero_optimization\": {\"stage\": 3}, \"strata\": {\"collective_timeout_ms\": 60000}}";
  strata_comm* comm = nullptr;
  ASSERT_STRATA_OK(strata_comm_create_mpi_world(&comm));
  strata_engine* e = nullptr;
  ASSERT_STRATA_OK(MakeEngine(comm, json, true, &e));
  MPI_Barrier(MPI_COMM_WORLD);
  auto start = std::chrono::steady_clock::now();
  const strata_status first = MicroBatch(e, rank == last ? std::vector<int>{1, 0} : std::vector<int>{0, 1});
  EXPECT_EQ(first, STRATA_ERR_FAILED_PRECONDITION) << "world rank " << rank << ": " << strata_last_error();
  EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr("different paths through the model"));
  EXPECT_THAT(std::string(strata_last_error()),
              ::testing::HasSubstr(absl::StrCat("rank ", last, ": the forward of unit 'b'")));
  EXPECT_LT(SecondsSince(start), 5.0) << "world rank " << rank;
  EXPECT_STRATA_OK(strata_engine_destroy(e));

  ASSERT_STRATA_OK(MakeEngine(comm, json, true, &e));
  ASSERT_STRATA_OK(MicroBatch(e, {0, 1}));
  strata_step_result r = STRATA_STEP_RESULT_INIT;
  ASSERT_STRATA_OK(strata_engine_step(e, &r));
  MPI_Barrier(MPI_COMM_WORLD);
  start = std::chrono::steady_clock::now();
  const strata_status later = MicroBatch(e, rank == last ? std::vector<int>{1} : std::vector<int>{0, 1});
  const std::string message = strata_last_error();
  EXPECT_LT(SecondsSince(start), 5.0) << "world rank " << rank << ": " << message;
  if (rank == last) {
    EXPECT_EQ(later, STRATA_ERR_FAILED_PRECONDITION) << message;
    EXPECT_THAT(message, ::testing::HasSubstr("unit order differs from the recorded one"));
  } else {
    EXPECT_EQ(later, STRATA_ERR_PEER_FAILED) << "world rank " << rank << ": " << message;
    EXPECT_THAT(message, ::testing::HasSubstr(absl::StrCat("rank ", last, " failed and will not join it")));
    EXPECT_THAT(message, ::testing::HasSubstr("unit order differs from the recorded one"));
  }
  EXPECT_STRATA_OK(strata_engine_destroy(e));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_STRATA_OK(strata_comm_destroy(comm));
}

TEST(CApiMpi, MpiCommNullIsInvalidArgument) {
  strata_comm* comm = nullptr;
  EXPECT_STRATA_ERROR(strata_comm_create_mpi(static_cast<int32_t>(MPI_Comm_c2f(MPI_COMM_NULL)), &comm),
                      STRATA_ERR_INVALID_ARGUMENT, "MPI_COMM_NULL");
  EXPECT_EQ(comm, nullptr);
}

class AdoptedConformance : public ::testing::TestWithParam<size_t> {};

TEST_P(AdoptedConformance, Passes) {
  MPI_Comm host = Reversed();
  comm::Options options;
  options.timeout_ms = 30000;
  options.name = "adopted";
  auto adopted = capi::AdoptMpiComm(static_cast<int>(MPI_Comm_c2f(host)), options);
  MPI_Comm_free(&host);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  device::HostDevice dev;
  auto stream = dev.CreateStream("adopted");
  ASSERT_TRUE(stream.ok()) << stream.status();
  comm::conformance::RankHarness h{**adopted, dev, **stream};
  comm::conformance::Cases()[GetParam()].body(h);
  const absl::Status st = (*stream)->Synchronize();  // drain before the communicator is freed
  EXPECT_TRUE(st.ok()) << "world rank " << WorldRank() << ": " << st;
  stream->reset();
}

INSTANTIATE_TEST_SUITE_P(AllCases, AdoptedConformance,
                         ::testing::Range(size_t{0}, comm::conformance::Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return comm::conformance::Cases()[info.param].name;
                         });

// Prints a failure of a rank whose normal output is suppressed, prefixed with its rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  const int rank_;
};

}  // namespace
}  // namespace strata::capi_test

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS || provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "capi_mpi_test: MPI_THREAD_MULTIPLE is not available\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = strata::capi_test::WorldRank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new strata::capi_test::RankFailurePrinter(rank));
  }
  const int local = RUN_ALL_TESTS();
  int global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();  // the host's job: Strata adopted MPI and never finalises it
  return global;
}
