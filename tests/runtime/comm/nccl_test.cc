// The NCCL back-end on a real GPU (label gpu; every test skips with the reason where no GPU is visible):
// the Communicator conformance suite at world size 1 (one H200 holds one NCCL rank), with the suite's
// arrays in CUDA managed memory so the same cases run on a device-buffer back-end; and the failures
// that must end in an error instead of a hang: an initialisation that a rank never joins, and a
// collective on an aborted communicator.
#include "runtime/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_device.h"
#include "tests/runtime/device/cuda_device_fixture.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::comm {
namespace {

using ::testing::HasSubstr;

void* ManagedAlloc(size_t bytes) {
  void* p = nullptr;
  return cudaMallocManaged(&p, bytes == 0 ? 1 : bytes) == cudaSuccess ? p : nullptr;
}
void ManagedFree(void* p) { cudaFree(p); }

Options Named(int64_t timeout_ms) {
  Options o;
  o.timeout_ms = timeout_ms;
  o.name = "test";
  return o;
}

absl::StatusOr<std::unique_ptr<Communicator>> WorldOfOne(const Options& options) {
  auto id = NewNcclId();
  if (!id.ok()) return id.status();
  return CreateNcclCommunicator(*id, 0, 1, options);
}

// Device 0 (skips without one); NCCL selects it for the communicators the tests create.
using Nccl = device::testing::CudaDeviceFixture;

class NcclConformance : public Nccl, public ::testing::WithParamInterface<size_t> {
 protected:
  void SetUp() override {
    Nccl::SetUp();
    if (IsSkipped()) return;
    conformance::SetArrayMemory({ManagedAlloc, ManagedFree});
  }
  void TearDown() override { conformance::SetArrayMemory(heap_); }

 private:
  const conformance::ArrayMemory heap_ = conformance::GetArrayMemory();
};

TEST_P(NcclConformance, Passes) {
  auto comm = WorldOfOne(Named(20000));
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto stream = cuda_->CreateStream("rank0");
  ASSERT_TRUE(stream.ok()) << stream.status();
  conformance::RankHarness h{**comm, *cuda_, **stream};
  conformance::Cases()[GetParam()].body(h);
  const absl::Status drained = (*stream)->Synchronize();  // the error cases fail streams of their own
  EXPECT_TRUE(drained.ok()) << drained;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(AllCases, NcclConformance, ::testing::Range(size_t{0}, conformance::Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return conformance::Cases()[info.param].name;
                         });

// Rank 0 of two, and rank 1 never starts: NCCL's own bootstrap would wait forever; Strata's
// initialisation is nonblocking and gives up at the deadline (Note [Nonblocking NCCL]).
TEST_F(Nccl, InitialisationThatARankNeverJoinsFailsAtTheDeadline) {
  auto id = NewNcclId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto start = std::chrono::steady_clock::now();
  auto comm = CreateNcclCommunicator(*id, 0, 2, Named(1500));
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 0 of 2"));
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("1500 ms"));
  EXPECT_GE(waited, std::chrono::milliseconds(1500)) << "it did not wait for the missing rank";
  EXPECT_LT(waited, std::chrono::seconds(20)) << "the deadline was not honoured";
}

TEST_F(Nccl, AnIdOfTheWrongSizeIsRefused) {
  auto comm = CreateNcclCommunicator("short", 0, 1, Named(1000));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
}

// After Abort every collective fails at once, naming the communicator, and Dup is refused.
TEST_F(Nccl, AnAbortedCommunicatorFailsEveryLaterCall) {
  auto comm = WorldOfOne(Named(5000));
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto stream = cuda_->CreateStream("s");
  ASSERT_TRUE(stream.ok());
  (*comm)->Abort(absl::InternalError("test"));
  const absl::Status st = (*comm)->Barrier(**stream).Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("'test'"));
  EXPECT_EQ((*comm)->Dup("again").status().code(), absl::StatusCode::kAborted);
}

// A host-only stream cannot carry NCCL collectives: InvalidArgument naming it, not a crash.
TEST_F(Nccl, AHostStreamIsRefused) {
  auto comm = WorldOfOne(Named(5000));
  ASSERT_TRUE(comm.ok()) << comm.status();
  struct NotCuda final : device::Stream {
    absl::string_view name() const override { return "host-only"; }
    void Enqueue(device::HostTask) override {}
    void Record(device::Event&) override {}
    void WaitFor(device::Event&) override {}
    absl::Status Synchronize() override { return absl::OkStatus(); }
    absl::Status status() override { return absl::OkStatus(); }
  } host;
  const absl::Status st = (*comm)->Barrier(host).Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("host-only"));
}

}  // namespace
}  // namespace strata::comm
