// The CUDA device on a real GPU (label gpu; skipped with the reason where none is visible): stream
// order with host tasks, events across streams, sticky task errors, the arena allocator's zeroed blocks
// and budget, the pinned pool registered with cudaHostRegister. (The NCCL back-end: tests/runtime/comm/nccl_test.cc.)
#include "runtime/device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/memory/cuda_arena_allocator.h"
#include "runtime/offload/pinned_pool.h"

namespace strata::device {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"

TEST(CudaStream, RunsHostTasksInOrderAndKeepsTheFirstError) {
  SKIP_WITHOUT_GPU();
  auto dev = CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto s = (*dev)->CreateStream("test");
  ASSERT_TRUE(s.ok());
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) (*s)->Enqueue([&order, i] { order.push_back(i); return absl::OkStatus(); });
  ASSERT_TRUE((*s)->Synchronize().ok());
  EXPECT_EQ(order, std::vector<int>({0, 1, 2, 3, 4}));
  (*s)->Enqueue([] { return absl::InternalError("first"); });
  std::atomic<bool> ran{false};
  (*s)->Enqueue([&] { ran = true; return absl::OkStatus(); });
  EXPECT_EQ((*s)->Synchronize().message(), "first");
  EXPECT_FALSE(ran) << "a task after a failure must be skipped";
}

TEST(CudaStream, EventsOrderAnotherStream) {
  SKIP_WITHOUT_GPU();
  auto dev = CudaDevice::Create(0);
  auto a = (*dev)->CreateStream("a"), b = (*dev)->CreateStream("b");
  auto e = (*dev)->CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && e != nullptr);
  std::atomic<int> stage{0};
  (*a)->Enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stage = 1;
    return absl::OkStatus();
  });
  (*a)->Record(*e);
  (*b)->WaitFor(*e);
  int seen = -1;
  (*b)->Enqueue([&] { seen = stage.load(); return absl::OkStatus(); });
  ASSERT_TRUE((*b)->Synchronize().ok());
  EXPECT_EQ(seen, 1);
}

TEST(CudaArenaAllocator, ZeroesBlocksAndHonoursTheBudget) {
  SKIP_WITHOUT_GPU();
  memory::MemoryTracker tracker;
  auto alloc = memory::CudaArenaAllocator::Create(1 << 20, &tracker);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  auto b = (*alloc)->Allocate(4096, memory::Kind::kScratch);
  ASSERT_TRUE(b.ok());
  std::vector<char> host(4096, 1);
  ASSERT_EQ(cudaMemcpy(host.data(), b->data(), 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  for (char c : host) ASSERT_EQ(c, 0);
  EXPECT_EQ((*alloc)->Allocate(2 << 20, memory::Kind::kScratch).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CudaPinnedPool, BuffersAreRegisteredHostMemory) {
  SKIP_WITHOUT_GPU();
  memory::HostAllocator alloc(memory::Tier::kPinnedHost, memory::kUnlimited, nullptr);
  auto pool = offload::PinnedPool::Create(
      {.buffer_count = 2, .buffer_bytes = 1 << 20, .pin = offload::PinMethod::kCudaHostRegister}, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, (*pool)->buffers()[1].data), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost) << "registered (page-locked) host memory";
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1 << 20), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(device, (*pool)->buffers()[1].data, 1 << 20, cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(device);
}

// WaitFor on an event with nothing on the device behind it (device::Event::waitable): a failed one makes
// the waiting stream fail with its status; a pending host-side one cannot be waited for on the device
// and fails the stream naming it, instead of being reinterpreted as a CUDA event.
TEST(CudaStream, WaitingForAnEventThatIsNotOnTheDevice) {
  SKIP_WITHOUT_GPU();
  auto dev = CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  struct HostOnly final : Event {
    explicit HostOnly(bool done, absl::Status s) : done(done), status(std::move(s)) {}
    absl::Status Synchronize() override { return status; }
    bool Query() override { return done; }
    int64_t completed_ns() const override { return 0; }
    bool done;
    absl::Status status;
  };
  auto failed_waiter = (*dev)->CreateStream("failed_waiter");
  auto pending_waiter = (*dev)->CreateStream("pending_waiter");
  auto ok_waiter = (*dev)->CreateStream("ok_waiter");
  ASSERT_TRUE(failed_waiter.ok() && pending_waiter.ok() && ok_waiter.ok());
  HostOnly failed(true, absl::DataLossError("refused before the device")), pending(false, absl::OkStatus()),
      finished(true, absl::OkStatus());
  (*failed_waiter)->WaitFor(failed);
  (*pending_waiter)->WaitFor(pending);
  (*ok_waiter)->WaitFor(finished);
  EXPECT_EQ((*failed_waiter)->Synchronize(), failed.status);
  const absl::Status p = (*pending_waiter)->Synchronize();
  EXPECT_EQ(p.code(), absl::StatusCode::kInvalidArgument) << p;
  EXPECT_NE(p.message().find("pending_waiter"), absl::string_view::npos) << p;
  EXPECT_TRUE((*ok_waiter)->Synchronize().ok());
}

}  // namespace
}  // namespace strata::device
