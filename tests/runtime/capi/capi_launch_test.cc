// strata_comm_create_mpi_world picks its world through the runtime's launcher (runtime/comm/launcher.h,
// Note [Launchers]): under a torchrun launch of several ranks MPI's world is each process alone, so the call
// is refused, naming the ways that work, instead of handing out N separate one-rank worlds. One MPI
// initialisation per process, so one test per binary.
#include <cstdlib>

#include "tests/runtime/capi/capi_test_util.h"

namespace {

TEST(StrataCommCreateMpiWorld, RefusesATorchrunLaunchOfSeveralRanks) {
  for (const char* mpi : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) ::unsetenv(mpi);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  strata_comm* c = nullptr;
  EXPECT_STRATA_ERROR(strata_comm_create_mpi_world(&c), STRATA_ERR_FAILED_PRECONDITION,
                      "started by torchrun (WORLD_SIZE=2)");
  EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr("`mpirun -n 2`"));
  EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr("strata_comm_create_nccl"));
  EXPECT_EQ(c, nullptr);
}

}  // namespace
