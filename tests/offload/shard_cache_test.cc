// Tests for offload/shard_cache: shards round-trip through NVMe when evicted, read-ahead is used by the
// next Pin and never evicts other read-ahead, pinned shards are never evicted or overwritten, eviction
// waits for leases released on another thread, and failed reads / writes are reported without losing
// the newest bytes; a held shard keeps its extent's bytes until its holder lets go. Runs on each I/O back-end.
#include "runtime/offload/shard_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using ::testing::HasSubstr;
using testing::FillPattern;
using testing::FirstMismatch;
using testing::TempDir;

constexpr int kShards = 6;
constexpr uint64_t kShardBytes = 3 * 4096 + 100;  // not a multiple of the I/O block

class ShardCacheTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override { testing::MakeQueueAndStore(GetParam(), dir_.path(), 1 << 20, &queue_, &store_); }
  void Make(size_t buffers) {
    auto pool = PinnedPool::Create({.buffer_count = buffers, .buffer_bytes = kShardBytes, .pin = PinMethod::kNone},
                                   &alloc_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(pool).value();
    auto c = ShardCache::Create(store_.get(), pool_.get(), std::vector<uint64_t>(kShards, kShardBytes),
                                memory::Kind::kParamShard);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(c).value();
  }
  absl::Status WriteSeed(int shard, uint64_t seed) {
    return cache_->Write(shard, [&](void* dst) {
      FillPattern(static_cast<char*>(dst), kShardBytes, seed);
      return absl::OkStatus();
    });
  }
  // Pins, waits, and returns the first byte that differs from the pattern of `seed` (-1: all equal).
  int64_t CheckSeed(int shard, uint64_t seed) {
    auto l = cache_->Pin(shard);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return -2;
    absl::Status s = l->ready().Wait();
    EXPECT_TRUE(s.ok()) << s;
    return s.ok() ? FirstMismatch(static_cast<const char*>(l->data()), kShardBytes, seed) : -2;
  }

  TempDir dir_;
  memory::MemoryTracker tracker_;
  memory::HostAllocator alloc_{memory::Tier::kPinnedHost, memory::kUnlimited, &tracker_};
  std::unique_ptr<IoQueue> queue_;
  std::unique_ptr<NvmeStore> store_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<ShardCache> cache_;
};

TEST_P(ShardCacheTest, ShardsSurviveEvictionThroughNvme) {
  Make(2);
  for (int k = 0; k < kShards; ++k) ASSERT_TRUE(WriteSeed(k, 100 + k).ok());
  EXPECT_EQ(cache_->stats().writes, uint64_t{kShards});
  // Only 2 buffers: most shards were evicted and come back from NVMe.
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < kShards; ++k) EXPECT_EQ(CheckSeed(k, 100 + k), -1) << "shard " << k;
  }
  EXPECT_GE(cache_->stats().reads, uint64_t{kShards});
  // Newer bytes replace older ones, evicted or not.
  ASSERT_TRUE(WriteSeed(3, 7).ok());
  for (int k = 0; k < kShards; ++k) EXPECT_EQ(CheckSeed(k, k == 3 ? 7 : 100 + k), -1) << "shard " << k;
  EXPECT_TRUE(cache_->Flush().ok());
}

TEST_P(ShardCacheTest, ReadAheadIsUsedAndNotEvictedByReadAhead) {
  Make(3);
  for (int k = 0; k < kShards; ++k) ASSERT_TRUE(WriteSeed(k, k).ok());
  ASSERT_TRUE(cache_->Flush().ok());
  // The cache holds shards 3, 4, 5 (the last written); read ahead 0, 1, 2 in their place.
  for (int k = 0; k < 3; ++k) cache_->Prefetch(k);
  cache_->Prefetch(3);  // every buffer holds unused read-ahead: nothing is evicted for more
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(cache_->cached(k)) << k;
  EXPECT_FALSE(cache_->cached(3));
  const uint64_t reads = cache_->stats().reads;
  for (int k = 0; k < 3; ++k) EXPECT_EQ(CheckSeed(k, k), -1);
  EXPECT_EQ(cache_->stats().reads, reads) << "the read-ahead served every pin";
  EXPECT_EQ(cache_->stats().hits, 3u);
}

TEST_P(ShardCacheTest, PinnedShardsAreNeitherEvictedNorOverwritten) {
  Make(2);
  for (int k = 0; k < kShards; ++k) ASSERT_TRUE(WriteSeed(k, k).ok());
  auto a = cache_->Pin(0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready().Wait().ok());
  // The other buffer cycles through every other shard; shard 0's bytes stay put.
  for (int k = 1; k < kShards; ++k) EXPECT_EQ(CheckSeed(k, k), -1);
  EXPECT_EQ(FirstMismatch(static_cast<const char*>(a->data()), kShardBytes, 0), -1);
  // Write(0) waits for the lease, here released by another thread as a stream would. The releaser marks the
  // release before it happens, so a Write that returned without waiting finds the mark unset (unless this thread
  // was held up for the releaser's whole 50 ms: then the test passes, never fails, by chance).
  std::atomic<bool> released{false};
  std::thread releaser([lease = std::move(a).value(), &released]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    released = true;
    lease.Reset();
  });
  ASSERT_TRUE(WriteSeed(0, 9).ok());
  EXPECT_TRUE(released) << "Write(0) did not wait for the lease";
  releaser.join();
  EXPECT_EQ(CheckSeed(0, 9), -1);
}

TEST_P(ShardCacheTest, PinWaitsForALeaseWhenEveryBufferIsPinned) {
  Make(2);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(WriteSeed(k, k).ok());
  auto a = cache_->Pin(0);
  auto b = cache_->Pin(1);
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread releaser([lease = std::move(b).value()]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lease.Reset();
  });
  EXPECT_EQ(CheckSeed(2, 2), -1);  // blocks until shard 1's lease goes, then evicts it
  releaser.join();
  EXPECT_FALSE(cache_->cached(1));
  EXPECT_EQ(FirstMismatch(static_cast<const char*>(a->data()), kShardBytes, 0), -1);
}

TEST_P(ShardCacheTest, ReadModifyWriteKeepsTheContents) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 5).ok());
  ASSERT_TRUE(WriteSeed(1, 6).ok());  // evicts shard 0
  ASSERT_FALSE(cache_->cached(0));
  ASSERT_TRUE(cache_->Write(0, [](void* dst) {
                       static_cast<char*>(dst)[10] ^= 1;
                       return absl::OkStatus();
                     }, /*keep=*/true).ok());
  auto l = cache_->Pin(0);
  ASSERT_TRUE(l.ok() && l->ready().Wait().ok());
  EXPECT_EQ(FirstMismatch(static_cast<const char*>(l->data()), kShardBytes, 5), 10);
}

TEST_P(ShardCacheTest, ReadingANeverWrittenShardIsRefused) {
  Make(2);
  auto l = cache_->Pin(4);
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(l->ready().Wait().message(), HasSubstr("before it was ever written"));
  EXPECT_EQ(cache_->Pin(kShards).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_P(ShardCacheTest, AFailedReadReachesTheLeaseAndTheNextPinReadsAgain) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  ASSERT_TRUE(WriteSeed(1, 2).ok());  // shard 0 evicted
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = EIO, .fail_only = IoOp::kRead});
  {
    auto l = cache_->Pin(0);
    ASSERT_TRUE(l.ok());
    absl::Status s = l->ready().Wait();
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("Input/output error"));
  }
  EXPECT_EQ(CheckSeed(0, 1), -1);  // the fault was one request: the retry reads the bytes
}

TEST_P(ShardCacheTest, AFailedWriteIsReportedAndTheNewestBytesAreKept) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  ASSERT_TRUE(cache_->Flush().ok());
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  ASSERT_TRUE(WriteSeed(0, 2).ok());  // issued; fails in the background
  // Evicting shard 0 for shard 1 reports the lost write and keeps shard 0's buffer.
  absl::Status s = WriteSeed(1, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 2), -1);  // still the newest bytes, from memory
  // Writing again persists them; after eviction they come back from NVMe.
  ASSERT_TRUE(cache_->Write(0, [](void*) { return absl::OkStatus(); }, /*keep=*/true).ok());
  ASSERT_TRUE(WriteSeed(1, 3).ok());
  EXPECT_FALSE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 2), -1);
}

TEST_P(ShardCacheTest, AFailingFillLeavesTheShardAsItWas) {
  Make(2);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  absl::Status s = cache_->Write(0, [](void* dst) {
    std::memset(dst, 0, 100);
    return absl::InternalError("fill failed");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(CheckSeed(0, 1), -1);
}

// BeginWrite / EndWrite are Write in two calls (shard::ParamStorage opens and closes a shard with them): a
// filled buffer is written through to NVMe, an unfilled one leaves the shard as it was.
TEST_P(ShardCacheTest, AWriteInTwoCallsIsWrittenThroughOrLeavesTheShard) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  auto dst = cache_->BeginWrite(0, /*keep=*/true);
  ASSERT_TRUE(dst.ok()) << dst.status();
  EXPECT_EQ(FirstMismatch(static_cast<const char*>(*dst), kShardBytes, 1), -1);  // kept
  std::memset(*dst, 0, 100);
  cache_->EndWrite(0, /*filled=*/false);
  EXPECT_EQ(CheckSeed(0, 1), -1);
  dst = cache_->BeginWrite(0);
  ASSERT_TRUE(dst.ok()) << dst.status();
  FillPattern(static_cast<char*>(*dst), kShardBytes, 7);
  cache_->EndWrite(0, /*filled=*/true);
  ASSERT_TRUE(WriteSeed(1, 3).ok());  // evicts shard 0: it comes back from NVMe
  EXPECT_FALSE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 7), -1);
}

// Note [Held shards]: a held extent keeps the bytes it had; a write of the shard waits until the holder, here
// another thread as a checkpoint's writer is, lets go, then goes through. The holder reads the extent 50 ms
// after the write began and marks its let-go before it happens, so a write that did not wait overwrites the
// bytes it reads or returns before the mark (unless this thread was held up for those 50 ms: then the test
// passes, never fails, by chance). Hold holds nothing of a never-written shard and reports a failed last write.
TEST_P(ShardCacheTest, AHeldShardKeepsItsBytesAndItsWriteWaitsForTheHolder) {
  Make(2);
  auto none = cache_->Hold(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  auto held = cache_->Hold(0);  // waits for the write in flight
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_FALSE(held->empty());
  std::atomic<bool> let_go{false};
  int64_t mismatch = -2;
  std::thread holder([&, extent = std::move(held).value()]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t bytes = NvmeStore::IoBytes(kShardBytes);
    char* buf = static_cast<char*>(std::aligned_alloc(NvmeStore::kAlignment, bytes));
    const absl::Status read = store_->Read(extent, memory::BufferView{buf, bytes, memory::Tier::kPinnedHost}).Wait();
    EXPECT_TRUE(read.ok()) << read;
    mismatch = FirstMismatch(buf, kShardBytes, 1);
    std::free(buf);
    let_go = true;
    extent.Reset();
    cache_->let_go()->Notify();
  });
  ASSERT_TRUE(WriteSeed(0, 9).ok());
  EXPECT_TRUE(let_go) << "the write did not wait for the holder";
  holder.join();
  EXPECT_EQ(mismatch, -1) << "the held extent was overwritten";
  ASSERT_TRUE(cache_->Flush().ok());
  for (int k = 1; k < kShards; ++k) ASSERT_TRUE(WriteSeed(k, k).ok());  // evicts shard 0: back from NVMe
  EXPECT_FALSE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 9), -1);
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  ASSERT_TRUE(WriteSeed(0, 2).ok());  // issued; fails in the background
  EXPECT_EQ(cache_->Hold(0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->Flush().code(), absl::StatusCode::kResourceExhausted);  // still reported
}

// After a failed write has been reported, the cache's buffer is the only copy of the newest bytes: a read-only
// access (BeginWrite with keep, EndRead: what an export of a frozen unit does) keeps it, Hold refuses to share the
// extent, which lacks them, and the eviction writes them again before it lets the buffer go.
TEST_P(ShardCacheTest, TheNewestBytesOfAFailedWriteSurviveAReadAHoldAndAnEviction) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  ASSERT_TRUE(cache_->Flush().ok());
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  ASSERT_TRUE(WriteSeed(0, 2).ok());  // issued; fails in the background
  EXPECT_EQ(cache_->BeginWrite(0, /*keep=*/true).status().code(), absl::StatusCode::kResourceExhausted);
  auto read = cache_->BeginWrite(0, /*keep=*/true);  // reported once: now a read of the newest bytes
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(FirstMismatch(static_cast<const char*>(*read), kShardBytes, 2), -1);
  cache_->EndRead(0);
  EXPECT_TRUE(cache_->cached(0));
  auto held = cache_->Hold(0);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kFailedPrecondition) << "shared an extent without the bytes";
  ASSERT_TRUE(WriteSeed(1, 3).ok());  // evicts shard 0: writes seed 2 first
  EXPECT_FALSE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 2), -1);  // back from NVMe
  held = cache_->Hold(0);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->empty());
}

// An eviction whose write of the newest bytes fails again reports it and keeps the buffer.
TEST_P(ShardCacheTest, AnEvictionThatCannotWriteTheNewestBytesKeepsThem) {
  Make(1);
  ASSERT_TRUE(WriteSeed(0, 1).ok());
  ASSERT_TRUE(cache_->Flush().ok());
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  ASSERT_TRUE(WriteSeed(0, 2).ok());
  EXPECT_EQ(cache_->BeginWrite(0, /*keep=*/true).status().code(), absl::StatusCode::kResourceExhausted);
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = EIO, .fail_only = IoOp::kWrite});
  const absl::Status evict = WriteSeed(1, 3);  // the eviction's write of shard 0 fails
  EXPECT_THAT(std::string(evict.message()), HasSubstr("Input/output error")) << evict;
  EXPECT_TRUE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 2), -1);
  const absl::Status again = WriteSeed(1, 3);  // written this time, then evicted
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_FALSE(cache_->cached(0));
  EXPECT_EQ(CheckSeed(0, 2), -1);
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardCacheTest, ::testing::ValuesIn(testing::Backends()),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::offload
