// The launcher choice (runtime/comm/launcher.h, Note [Launchers]): which world a process belongs to, from
// what MPI sees and torchrun's variables, and the refusal of a multi-rank torchrun launch on the host.
// StartWorlds runs in every MPI test of mlp_train and the CLI (tests/integration, tests/examples).
#include "runtime/comm/launcher.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;

TorchrunEnv Torchrun(int rank, int world) { return TorchrunEnv{rank, world, rank % 2, "node0", 29500}; }

TEST(ChooseLaunch, AnMpiWorldOfSeveralRanksWinsOverTorchrunVariables) {
  absl::StatusOr<Launch> l = ChooseLaunch(2, 4, Torchrun(1, 8));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->rank, 2);
  EXPECT_EQ(l->size, 4);
  EXPECT_FALSE(l->torchrun.has_value());
}

TEST(ChooseLaunch, WithoutTorchrunIsMpisOneRank) {
  absl::StatusOr<Launch> l = ChooseLaunch(0, 1, absl::NotFoundError("not a torchrun launch"));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->rank, 0);
  EXPECT_EQ(l->size, 1);
  EXPECT_FALSE(l->torchrun.has_value());
}

TEST(ChooseLaunch, UnderTorchrunTakesItsRankAndWorld) {
  absl::StatusOr<Launch> l = ChooseLaunch(0, 1, Torchrun(3, 4));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->size, 4);
  ASSERT_TRUE(l->torchrun.has_value());
  EXPECT_EQ(l->torchrun->local_rank, 1);
  EXPECT_EQ(l->torchrun->master_addr, "node0");
}

TEST(ChooseLaunch, AMalformedTorchrunVariableIsAnErrorOnlyOutsideAnMpiWorld) {
  const absl::Status bad = absl::InvalidArgumentError("WORLD_SIZE='two' is not an integer");
  absl::StatusOr<Launch> l = ChooseLaunch(0, 1, bad);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("WORLD_SIZE"));
  EXPECT_TRUE(ChooseLaunch(1, 2, bad).ok()) << "under mpirun the torchrun variables are not ours";
}

TEST(RefuseHostTorchrun, RefusesSeveralTorchrunRanksOnTheHostNamingTheMpirunCommand) {
  const Launch torchrun4{1, 4, Torchrun(1, 4)};
  std::optional<std::string> why = RefuseHostTorchrun(torchrun4, device::DeviceKind::kHost, "mlp_train");
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("WORLD_SIZE=4"));
  EXPECT_THAT(*why, HasSubstr("`mpirun -n 4 mlp_train ...`"));
  EXPECT_FALSE(RefuseHostTorchrun(torchrun4, device::DeviceKind::kCuda, "mlp_train")) << "NCCL bootstraps on GPUs";
  EXPECT_FALSE(RefuseHostTorchrun(Launch{0, 1, Torchrun(0, 1)}, device::DeviceKind::kHost, "x")) << "one rank";
  EXPECT_FALSE(RefuseHostTorchrun(Launch{1, 4, std::nullopt}, device::DeviceKind::kHost, "x")) << "MPI";
}

// The environment path: DetectLaunch reads the torchrun variables only when MPI's world is one rank.
TEST(DetectLaunch, ReadsTorchrunsVariablesOnlyWhenMpisWorldIsOneRank) {
  for (const char* mpi : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) ::unsetenv(mpi);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  absl::StatusOr<Launch> torchrun = DetectLaunch(0, 1);
  absl::StatusOr<Launch> mpi = DetectLaunch(2, 3);
  ::setenv("WORLD_SIZE", "two", 1);
  absl::StatusOr<Launch> bad = DetectLaunch(0, 1);
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  absl::StatusOr<Launch> none = DetectLaunch(0, 1);

  ASSERT_TRUE(torchrun.ok()) << torchrun.status();
  EXPECT_TRUE(torchrun->torchrun.has_value());
  EXPECT_EQ(torchrun->rank, 1);
  EXPECT_EQ(torchrun->size, 2);
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  EXPECT_FALSE(mpi->torchrun.has_value());
  EXPECT_EQ(mpi->size, 3);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("WORLD_SIZE"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->torchrun.has_value());
}

}  // namespace
}  // namespace strata::comm
