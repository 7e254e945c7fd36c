// Tests for runtime/comm/shm_communicator over the processes of an mpirun job, MPI the bootstrap: the
// conformance suite, and the sums bit for bit against the MPI back-end's on the same inputs (Note
// [Shared-memory sums]). Run as `scripts/mpirun_local -n N comm_shm_mpi_test` (ctest does so for N = 2..4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/shm_communicator.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"
#include "tests/runtime/mpi_gtest_main.h"

namespace strata::comm {
namespace {

MpiRuntime* g_runtime = nullptr;  // set by main() for the duration of RUN_ALL_TESTS

Options Named(const std::string& name) {
  Options o;
  o.timeout_ms = 30000;  // a hang becomes a failure naming the collective well before ctest's limit
  o.name = name;
  return o;
}

// The MPI world communicator and a shared-memory one bootstrapped over it, and a stream to issue on.
struct Pair {
  std::unique_ptr<Communicator> mpi;
  std::unique_ptr<Communicator> shm;
  device::HostDevice dev;
  std::unique_ptr<device::Stream> stream;
};
void Open(Pair* p) {
  ASSERT_NE(g_runtime, nullptr);
  auto mpi = g_runtime->World(Named("mpi"));
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  p->mpi = std::move(*mpi);
  auto shm = CreateShmCommunicator(*p->mpi, Named("shm"));
  ASSERT_TRUE(shm.ok()) << shm.status();
  p->shm = std::move(*shm);
  auto stream = p->dev.CreateStream("world");
  ASSERT_TRUE(stream.ok()) << stream.status();
  p->stream = std::move(*stream);
}

class ShmMpiConformance : public ::testing::TestWithParam<size_t> {};

TEST_P(ShmMpiConformance, Passes) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Open(&p));
  EXPECT_EQ(p.shm->rank(), g_runtime->world_rank());
  EXPECT_EQ(p.shm->size(), g_runtime->world_size());
  conformance::RankHarness h{*p.shm, p.dev, *p.stream};
  conformance::Cases()[GetParam()].body(h);
  static_cast<void>(p.stream->Synchronize());  // drain before the communicators go; error cases leave it failed
  p.stream.reset();
}

INSTANTIATE_TEST_SUITE_P(AllCases, ShmMpiConformance, ::testing::Range(size_t{0}, conformance::Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return conformance::Cases()[info.param].name;
                         });

// A wide-ranged input, so that sums in different orders round differently (as mpi_test.cc's), in `dtype`.
std::vector<char> Spread(DType dtype, int rank, size_t count, int salt) {
  std::vector<char> out(count * DTypeBytes(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = (i + 1 + static_cast<uint64_t>(salt) * 7919) * 0x9E3779B97F4A7C15ull ^
                       (static_cast<uint64_t>(rank) + 1) * 0xC2B2AE3D27D4EB4Full;
    const float v =
        std::ldexp(static_cast<float>(static_cast<int>(h % 2001) - 1000), static_cast<int>((h >> 20) % 24) - 12);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = dtype == DType::kBF16 ? kernels::FloatToBf16(v) : kernels::FloatToHalf(v);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

size_t Differing(const std::vector<char>& a, const std::vector<char>& b, size_t esz) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); i += esz) n += std::memcmp(a.data() + i, b.data() + i, esz) != 0;
  return n;
}

struct SumCase {
  bool all_reduce;
  DType dtype;
  ReduceOp op;
  size_t count;  // a reduce-scatter's block, an all-reduce's count
  bool in_place;
};

// Note [Shared-memory sums]: every element of a reduce-scatter and an all-reduce is the MPI back-end's,
// bit for bit, on blocks of 1 MiB or more (rank order) and smaller ones (Open MPI's collective), for every
// dtype, sum and average, in place and not.
TEST(ShmMpiSums, AreTheMpiBackEndsBitForBit) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Open(&p));
  const int world = g_runtime->world_size(), rank = g_runtime->world_rank();
  const size_t big_f32 = (size_t{5} << 20) / 16, big_16 = (size_t{5} << 20) / 8;  // 1.25 MiB blocks
  std::vector<SumCase> cases;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t big = d == DType::kF32 ? big_f32 : big_16;
    for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{40000}, big}) {
      cases.push_back({false, d, ReduceOp::kSum, count, false});
      cases.push_back({true, d, ReduceOp::kSum, count, false});
    }
    cases.push_back({false, d, ReduceOp::kAvg, big + 3, false});
    cases.push_back({true, d, ReduceOp::kAvg, 1001, true});
    cases.push_back({true, d, ReduceOp::kSum, world * big + 5, true});  // blocks of 1 MiB and more, in place
    cases.push_back({true, d, ReduceOp::kSum, world * big - 5, false});
  }
  int salt = 0;
  for (const SumCase& c : cases) {
    const size_t esz = DTypeBytes(c.dtype), in_count = c.all_reduce ? c.count : c.count * world;
    const std::vector<char> in = Spread(c.dtype, rank, in_count, ++salt);
    const size_t out_bytes = c.count * esz;
    std::vector<std::vector<char>> got;
    for (Communicator* comm : {p.mpi.get(), p.shm.get()}) {
      std::vector<char> send = in, recv(c.in_place ? 0 : out_bytes);
      void* out = c.in_place ? send.data() : recv.data();
      const absl::Status s = c.all_reduce
                                 ? comm->AllReduce(send.data(), out, c.count, c.dtype, c.op, *p.stream).Wait()
                                 : comm->ReduceScatter(send.data(), out, c.count, c.dtype, c.op, *p.stream).Wait();
      ASSERT_TRUE(s.ok()) << comm->options().name << ": " << s;
      got.push_back(c.in_place ? std::move(send) : std::move(recv));
    }
    EXPECT_EQ(Differing(got[0], got[1], esz), 0u)
        << "rank " << rank << " of " << world << ": " << (c.all_reduce ? "all_reduce" : "reduce_scatter") << " of "
        << c.count << " " << DTypeName(c.dtype) << (c.op == ReduceOp::kAvg ? " avg" : " sum")
        << (c.in_place ? " in place" : "") << ": elements differ from the MPI back-end's";
  }
  ASSERT_TRUE(p.stream->Synchronize().ok());
}

}  // namespace
}  // namespace strata::comm

int main(int argc, char** argv) {
  return strata::testing::RunMpiTests(argc, argv, "comm_shm_mpi_test", &strata::comm::g_runtime);
}
