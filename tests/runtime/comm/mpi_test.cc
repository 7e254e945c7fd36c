// Tests for runtime/comm/mpi_communicator: the conformance suite on the real MPI world communicator.
// Run as `scripts/mpirun_local -n N comm_mpi_test` (ctest does so for N = 1..4).
//
// This binary has its own main() (tests/runtime/mpi_gtest_main.h): MPI is initialised once per process.
// Killing ranks and the timeout path are covered by the integration tests, not here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

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

// The world communicator (30 s timeout) and a stream to issue on, for the tests below; the stream goes
// before the communicator.
struct World {
  std::unique_ptr<Communicator> comm;
  device::HostDevice dev;
  std::unique_ptr<device::Stream> stream;
};
void OpenWorld(World* w) {
  ASSERT_NE(g_runtime, nullptr);
  Options options;
  options.timeout_ms = 30000;
  options.name = "world";
  auto comm = g_runtime->World(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  w->comm = std::move(*comm);
  auto stream = w->dev.CreateStream("world");
  ASSERT_TRUE(stream.ok()) << stream.status();
  w->stream = std::move(*stream);
}

// VmHWM in KiB, from /proc/self/status.
long HighWaterKib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

// Resets VmHWM to the current resident set (5 in /proc/self/clear_refs).
void ResetHighWater() {
  std::FILE* clear = std::fopen("/proc/self/clear_refs", "w");
  ASSERT_NE(clear, nullptr) << "cannot reset the peak resident set";
  ASSERT_EQ(std::fputs("5", clear), 1);
  ASSERT_EQ(std::fclose(clear), 0);
}

// Note [Reduce-scatter over point to point]: a reduce-scatter costs no buffer of its input's size on any
// rank (Open MPI's own one costs rank 0 a temporary of the whole input). Each rank's peak resident
// set is reset after its buffers are written, and may then grow by less than half of one block (the
// back-end's transfer buffers are 2 MiB per peer; at 4 ranks 9 MiB was measured, and 128 MiB on rank 0
// with MPI_Ireduce_scatter_block).
TEST(MpiReduceScatter, NeedsNoTemporaryOfTheInputsSize) {
  ASSERT_NE(g_runtime, nullptr);
  const int world = g_runtime->world_size(), rank = g_runtime->world_rank();
  if (world == 1) GTEST_SKIP() << "one rank moves nothing";
  if (world > 8) GTEST_SKIP() << "beyond 8 ranks the back-end uses MPI's collective (docs/decisions/0022)";
  World w;
  ASSERT_NO_FATAL_FAILURE(OpenWorld(&w));
  constexpr size_t kBlock = size_t{32} << 20 >> 2;  // 32 MiB of fp32 per rank
  std::vector<float> send(kBlock * world), recv(kBlock, -1.0f);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((i + rank) % 7);
  ASSERT_NO_FATAL_FAILURE(ResetHighWater());
  const long before = HighWaterKib();
  const absl::Status st =
      w.comm->ReduceScatter(send.data(), recv.data(), kBlock, DType::kF32, ReduceOp::kSum, *w.stream).Wait();
  const long grown_kib = HighWaterKib() - before;
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_LT(grown_kib, static_cast<long>(kBlock * 4 / 2 / 1024)) << "rank " << rank << " of " << world;
  for (size_t i = 0; i < kBlock; i += 4099) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += static_cast<float>((rank * kBlock + i + r) % 7);
    ASSERT_EQ(recv[i], want) << "rank " << rank << ", element " << i;
  }
  // The all-reduce in place over the same buffer (Note [All-reduce over point to point]).
  ASSERT_NO_FATAL_FAILURE(ResetHighWater());
  const long before_ar = HighWaterKib();
  const absl::Status ar =
      w.comm->AllReduce(send.data(), send.data(), send.size(), DType::kF32, ReduceOp::kSum, *w.stream).Wait();
  const long grown_ar_kib = HighWaterKib() - before_ar;
  ASSERT_TRUE(ar.ok()) << ar;
  EXPECT_LT(grown_ar_kib, static_cast<long>(kBlock * 4 / 2 / 1024)) << "all_reduce, rank " << rank << " of " << world;
  for (size_t i = 0; i < send.size(); i += 4099) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += static_cast<float>((i + r) % 7);
    ASSERT_EQ(send[i], want) << "all_reduce, rank " << rank << ", element " << i;
  }
  ASSERT_TRUE(w.stream->Synchronize().ok());
}

// A wide-ranged fp32 input, so that sums in different orders round differently.
float Spread(int rank, size_t i) {
  const uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) + 1) * 0xC2B2AE3D27D4EB4Full;
  return std::ldexp(static_cast<float>(static_cast<int>(h % 2001) - 1000), static_cast<int>((h >> 20) % 48) - 24);
}

// Note [Reduce-scatter over point to point]: blocks of 1 MiB or more are summed in rank order, so the
// result is bit for bit ((x0 + x1) + x2) + ... in fp32, whichever peer's chunk arrives first.
TEST(MpiReduceScatter, SumsInRankOrder) {
  ASSERT_NE(g_runtime, nullptr);
  const int world = g_runtime->world_size(), rank = g_runtime->world_rank();
  if (world > 8) GTEST_SKIP() << "beyond 8 ranks the back-end uses MPI's collective (docs/decisions/0022)";
  World w;
  ASSERT_NO_FATAL_FAILURE(OpenWorld(&w));
  constexpr size_t kBlock = (size_t{5} << 20) / 8;  // 2.5 MiB of fp32: three transfers, the last partial
  std::vector<float> send(kBlock * world), recv(kBlock);
  for (size_t i = 0; i < send.size(); ++i) send[i] = Spread(rank, i);
  const absl::Status st =
      w.comm->ReduceScatter(send.data(), recv.data(), kBlock, DType::kF32, ReduceOp::kSum, *w.stream).Wait();
  ASSERT_TRUE(st.ok()) << st;
  size_t wrong = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    float want = Spread(0, rank * kBlock + i);
    for (int r = 1; r < world; ++r) want += Spread(r, rank * kBlock + i);
    wrong += std::memcmp(&want, &recv[i], 4) != 0;
  }
  EXPECT_EQ(wrong, 0u) << "rank " << rank << " of " << world << ": elements not the rank-order sum";
  // The all-reduce: every rank ends with the rank-order sums of every element.
  std::vector<float> all(kBlock * world + 3);
  for (size_t i = 0; i < all.size(); ++i) all[i] = Spread(rank, i);
  const absl::Status ar =
      w.comm->AllReduce(all.data(), all.data(), all.size(), DType::kF32, ReduceOp::kSum, *w.stream).Wait();
  ASSERT_TRUE(ar.ok()) << ar;
  wrong = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    float want = Spread(0, i);
    for (int r = 1; r < world; ++r) want += Spread(r, i);
    wrong += std::memcmp(&want, &all[i], 4) != 0;
  }
  EXPECT_EQ(wrong, 0u) << "rank " << rank << " of " << world << ": all_reduce elements not the rank-order sum";
  ASSERT_TRUE(w.stream->Synchronize().ok());
}

// Ranks that disagree on the count fail, each of them, instead of summing what a shorter message left
// in the buffer: the rank expecting more names the rank that sent less.
TEST(MpiReduceScatter, CountMismatchFailsOnBothRanks) {
  ASSERT_NE(g_runtime, nullptr);
  const int world = g_runtime->world_size(), rank = g_runtime->world_rank();
  if (world != 2) GTEST_SKIP() << "written for 2 ranks";
  World w;
  ASSERT_NO_FATAL_FAILURE(OpenWorld(&w));
  const size_t count = (size_t{1} << 18) + (rank == 0 ? 10 : 5);  // 1 MiB and a few: two transfers each
  std::vector<float> send(count * world, 1.0f), recv(count);
  const absl::Status st =
      w.comm->ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum, *w.stream).Wait();
  EXPECT_FALSE(st.ok()) << "rank " << rank;
  if (rank == 0) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("rank 1 sent 5 elements"), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("disagree on the count"), absl::string_view::npos) << st;
  }
}

}  // namespace
}  // namespace strata::comm

int main(int argc, char** argv) {
  return strata::testing::RunMpiTests(argc, argv, "comm_mpi_test", &strata::comm::g_runtime);
}
