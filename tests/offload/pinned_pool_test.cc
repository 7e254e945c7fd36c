// Tests for offload/pinned_pool: accounting and budget, locking, hand-out and reuse, the locked-memory
// limit (checked in a child process that gives up CAP_IPC_LOCK, since root is not bound by the limit),
// and registration of the pool with the io_uring queue.
#include "runtime/offload/pinned_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/offload/io_queue.h"

namespace strata::offload {
namespace {

using ::testing::HasSubstr;

constexpr size_t kMiB = 1 << 20;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kMlockIsANoOp = true;  // the sanitizer runtimes intercept mlock and ignore it
#else
constexpr bool kMlockIsANoOp = false;
#endif

memory::HostAllocator PinnedAllocator(uint64_t budget, memory::MemoryTracker* t) {
  return memory::HostAllocator(memory::Tier::kPinnedHost, budget, t);
}

// The smaps fields of the mapping that contains `p`: {"VmFlags", "hg ..."}, {"AnonHugePages", "4096 kB"}.
std::map<std::string, std::string> SmapsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  std::map<std::string, std::string> fields;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') == std::string::npos || line.find('-') < line.find(':')) {
      if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
        if (inside) break;
        inside = lo <= a && a < hi;
        continue;
      }
    }
    if (inside) {
      const size_t colon = line.find(':');
      fields[line.substr(0, colon)] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return fields;
}

// Note [Huge pages]: a pool of 2 MiB or more asks for transparent huge pages (MADV_HUGEPAGE), so a 1 MiB
// O_DIRECT request is one physically contiguous segment instead of 256 (virtio-blk here takes 254 and
// splits the rest: `strata bench nvme` reads went from ~1.3 to ~3.6 GB/s). Whether the kernel finds a
// huge page at fault time depends on fragmentation, so the test checks the advice (VmFlags "hg").
TEST(PinnedPool, LargePoolsAskForTransparentHugePages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  if (!std::getline(thp, mode) || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off here";
  }
  memory::MemoryTracker tracker;
  auto alloc = PinnedAllocator(memory::kUnlimited, &tracker);
  auto pool = PinnedPool::Create({.buffer_count = 4, .buffer_bytes = kMiB, .pin = PinMethod::kNone}, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const auto fields = SmapsOf((*pool)->buffers()[0].data);
  ASSERT_TRUE(fields.count("VmFlags")) << "no smaps entry for the pool";
  EXPECT_THAT(fields.at("VmFlags"), HasSubstr("hg"));
  std::printf("pool mapping: AnonHugePages %s\n",
              fields.count("AnonHugePages") ? fields.at("AnonHugePages").c_str() : "?");
}

TEST(PinnedPool, BuffersAreAlignedLockedAndCharged) {
  memory::MemoryTracker tracker;
  auto alloc = PinnedAllocator(memory::kUnlimited, &tracker);
  const uint64_t locked_before = ReadMemlockInfo().locked_bytes;
  auto pool = PinnedPool::Create({.buffer_count = 3, .buffer_bytes = kMiB + 1}, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*pool)->locked());
  EXPECT_EQ((*pool)->buffer_bytes(), kMiB + 4096);
  EXPECT_EQ(tracker.tier(memory::Tier::kPinnedHost).current_bytes, 3 * (kMiB + 4096));
  EXPECT_EQ(tracker.kind(memory::Tier::kPinnedHost, memory::Kind::kScratch).current_bytes, 3 * (kMiB + 4096));
  if (!kMlockIsANoOp) {
    EXPECT_GE(ReadMemlockInfo().locked_bytes, locked_before + 3 * (kMiB + 4096));
  }
  for (const memory::BufferView& v : (*pool)->buffers()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 4096, 0u);
    EXPECT_EQ(v.tier, memory::Tier::kPinnedHost);
  }
  pool->reset();
  EXPECT_EQ(tracker.tier(memory::Tier::kPinnedHost).current_bytes, 0u);
}

TEST(PinnedPool, OverBudgetIsResourceExhaustedNamingTheTier) {
  memory::MemoryTracker tracker;
  auto alloc = PinnedAllocator(3 * kMiB, &tracker);
  auto pool = PinnedPool::Create({.buffer_count = 4, .buffer_bytes = kMiB}, &alloc);
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("tier 'pinned_host' is out of budget"));
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("asked 4.00 MiB"));
  EXPECT_EQ(tracker.tier(memory::Tier::kPinnedHost).current_bytes, 0u);
}

TEST(PinnedPool, WrongTierOrEmptyShapeIsInvalid) {
  memory::HostAllocator device(memory::Tier::kDevice, memory::kUnlimited, nullptr);
  EXPECT_EQ(PinnedPool::Create({}, &device).status().code(), absl::StatusCode::kInvalidArgument);
  auto alloc = PinnedAllocator(memory::kUnlimited, nullptr);
  EXPECT_EQ(PinnedPool::Create({.buffer_count = 0}, &alloc).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PinnedPool, BuffersAreReturnedAndReused) {
  auto alloc = PinnedAllocator(memory::kUnlimited, nullptr);
  auto pool = PinnedPool::Create({.buffer_count = 2, .buffer_bytes = 4096, .pin = PinMethod::kNone}, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  PinnedBuffer a = (*pool)->Acquire();
  PinnedBuffer b = (*pool)->Acquire();
  EXPECT_NE(a.data(), b.data());
  auto none = (*pool)->TryAcquire();
  ASSERT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("all 2 pinned buffers"));
  void* const a_data = a.data();
  a.Reset();
  EXPECT_EQ((*pool)->free_count(), 1u);
  auto again = (*pool)->TryAcquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), a_data) << "the returned buffer is handed out next";
  // A blocked Acquire wakes when another thread returns a buffer.
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    PinnedBuffer c = (*pool)->Acquire();
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());
  b.Reset();
  waiter.join();
  EXPECT_TRUE(got.load());
  again->Reset();
  EXPECT_EQ((*pool)->free_count(), 2u);
}

// On CUDA builds tests/runtime/device/cuda_device_test.cc (label gpu) checks the registration itself.
TEST(PinnedPool, CudaPinningNeedsACudaBuild) {
#if STRATA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: CudaPinnedPool.BuffersAreRegisteredHostMemory covers kCudaHostRegister";
#else
  auto alloc = PinnedAllocator(memory::kUnlimited, nullptr);
  auto pool =
      PinnedPool::Create({.buffer_count = 1, .buffer_bytes = 4096, .pin = PinMethod::kCudaHostRegister}, &alloc);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("STRATA_WITH_CUDA"));
#endif
}

// Drops CAP_IPC_LOCK (so RLIMIT_MEMLOCK binds), lowers the limit to 1 MiB, asks for 4 MiB: exit code 0
// when the error is the expected one, 1 when it succeeded, 2 when the message is wrong.
[[noreturn]] void LowMemlockChild() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  syscall(SYS_capget, &header, data);
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &header, data) != 0) _exit(3);
  rlimit rl{kMiB, kMiB};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(4);
  auto alloc = PinnedAllocator(memory::kUnlimited, nullptr);
  auto pool = PinnedPool::Create({.buffer_count = 4, .buffer_bytes = kMiB}, &alloc);
  if (pool.ok()) _exit(1);
  const std::string msg(pool.status().message());
  std::fprintf(stderr, "%s\n", msg.c_str());
  const bool good = pool.status().code() == absl::StatusCode::kFailedPrecondition &&
                    msg.find("RLIMIT_MEMLOCK is 1.00 MiB") != std::string::npos &&
                    msg.find("needs 4.00 MiB") != std::string::npos && msg.find("ulimit -l") != std::string::npos;
  _exit(good ? 0 : 2);
}

TEST(PinnedPoolDeathTest, LockedMemoryLimitTooLowNamesTheLimitAndTheNeed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(LowMemlockChild(), ::testing::ExitedWithCode(0), "RLIMIT_MEMLOCK is 1.00 MiB");
}

TEST(PinnedPool, RegistersWithTheUringQueue) {
  if (!UringCompiledIn()) GTEST_SKIP() << "built without io_uring";
  auto q = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kUring, .depth = 4});
  if (!q.ok()) GTEST_SKIP() << "io_uring unavailable: " << q.status();
  auto alloc = PinnedAllocator(memory::kUnlimited, nullptr);
  auto pool = PinnedPool::Create({.buffer_count = 2, .buffer_bytes = kMiB}, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*q)->RegisterBuffers((*pool)->buffers()).ok());
}

}  // namespace
}  // namespace strata::offload
