// The CUDA device on a real GPU (label gpu; skipped with the reason where none is visible): stream
// order with host tasks, events across streams, sticky task errors, the arena allocator's zeroed blocks
// and budget, the pinned pool registered with cudaHostRegister, and the NCCL back-end at world size 1
// against host-computed results.
#include "runtime/device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "offload/pinned_pool.h"
#include "runtime/memory/cuda_arena_allocator.h"
#if STRATA_WITH_NCCL
#include "runtime/comm/nccl_communicator.h"
#endif

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
  (*a)->Enqueue([&] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); stage = 1; return absl::OkStatus(); });
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

#if STRATA_WITH_NCCL
TEST(Nccl, WorldSizeOneCollectivesMatchTheHost) {
  SKIP_WITHOUT_GPU();
  auto dev = CudaDevice::Create(0);
  auto s = (*dev)->CreateStream("nccl");
  auto id = comm::NewNcclId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto c = comm::CreateNcclCommunicator(*id, 0, 1, comm::Options{});
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t n = 1001;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = float(i % 7) - 3;
  float *x = nullptr, *y = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&y), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (int op = 0; op < 3; ++op) {
    comm::Work w = op == 0   ? (*c)->AllGather(x, y, n, DType::kF32, **s)
                   : op == 1 ? (*c)->ReduceScatter(x, y, n, DType::kF32, comm::ReduceOp::kSum, **s)
                             : (*c)->AllReduce(x, y, n, DType::kF32, comm::ReduceOp::kAvg, **s);
    ASSERT_TRUE(w.Wait().ok()) << op;
    std::vector<float> out(n);
    ASSERT_EQ(cudaMemcpy(out.data(), y, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out, host) << "op " << op;
  }
  cudaFree(x);
  cudaFree(y);
}
#endif

}  // namespace
}  // namespace strata::device
