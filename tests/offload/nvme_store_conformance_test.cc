// The NvmeStore conformance suite (CONVENTIONS 9): every case runs on each I/O back-end (io_uring,
// threads). Files live under /tmp (ext4 here, so O_DIRECT is in effect; a case checks the buffered
// fallback too). Cases: round trips of many extents at awkward sizes with exact and padded buffers,
// requests in flight from several threads, striping across two paths, a deep queue, short transfers,
// budgets and accounting, checksum failures, failed writes, and argument errors.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/offload/nvme_store.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using testing::AlignedBuffer;
using testing::FillPattern;
using testing::FirstMismatch;
using ::testing::HasSubstr;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

#define OPEN_STORE(...) \
  Open(__VA_ARGS__);    \
  if (IsSkipped() || HasFatalFailure()) return
// Awkward sizes: 1 byte, odd, one short of / one past a block, several blocks plus a tail, past a stripe.
constexpr uint64_t kSizes[] = {1, 7, 4095, 4096, 4097, 65536 + 3, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) - 5};

class NvmeStoreTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  // Creates the queue and a store over `paths` (default: one scratch dir); skips when io_uring is refused
  // (callers use OPEN_STORE, which returns from the test then).
  void Open(uint64_t capacity, std::vector<std::string> paths = {}, uint32_t depth = 32) {
    IoQueueOptions qo;
    qo.backend = GetParam();
    qo.depth = depth;
    auto q = CreateIoQueue(qo);
    if (!q.ok() && GetParam() == IoBackend::kUring) GTEST_SKIP() << "io_uring unavailable: " << q.status();
    ASSERT_TRUE(q.ok()) << q.status();
    queue_ = std::move(q).value();
    NvmeStoreOptions so;
    so.files.paths = paths.empty() ? std::vector<std::string>{dir_.path()} : paths;
    so.files.capacity_bytes = capacity;
    so.files.stripe_bytes = stripe_bytes_;
    so.files.refuse_direct_for_test = refuse_direct_;
    so.budget_bytes = budget_;
    so.tracker = &tracker_;
    auto s = NvmeStore::Create(so, queue_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
  }
  NvmeExtent Alloc(uint64_t bytes) {
    auto e = store_->Allocate(bytes, memory::Kind::kOptimizerState);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(e).value() : NvmeExtent();
  }
  // Writes every extent from its own buffer (exact or padded size) concurrently, reads all back
  // concurrently into fresh buffers and compares.
  void RoundTrip(std::vector<NvmeExtent>& extents, bool padded, uint64_t seed0) {
    std::vector<std::unique_ptr<AlignedBuffer>> out, in;
    std::vector<IoWork> works;
    for (size_t i = 0; i < extents.size(); ++i) {
      const uint64_t n = padded ? extents[i].io_bytes() : extents[i].bytes();
      out.push_back(std::make_unique<AlignedBuffer>(n));
      in.push_back(std::make_unique<AlignedBuffer>(n));
      FillPattern(out[i]->data(), extents[i].bytes(), seed0 + i);
      works.push_back(store_->Write(extents[i], out[i]->view()));
    }
    ASSERT_TRUE(WaitAll(works).ok()) << WaitAll(works);
    works.clear();
    for (size_t i = 0; i < extents.size(); ++i) works.push_back(store_->Read(extents[i], in[i]->view()));
    ASSERT_TRUE(WaitAll(works).ok()) << WaitAll(works);
    for (size_t i = 0; i < extents.size(); ++i) {
      EXPECT_EQ(FirstMismatch(in[i]->data(), extents[i].bytes(), seed0 + i), -1)
          << "extent " << i << " of " << extents[i].bytes() << " bytes, " << (padded ? "padded" : "exact") << " buffer";
    }
  }

  TempDir dir_;
  uint64_t stripe_bytes_ = kMiB;
  uint64_t budget_ = memory::kUnlimited;
  bool refuse_direct_ = false;
  memory::MemoryTracker tracker_;
  std::unique_ptr<IoQueue> queue_;
  std::unique_ptr<NvmeStore> store_;
};

TEST_P(NvmeStoreTest, RoundTripsManyExtentsAtAwkwardSizes) {
  OPEN_STORE(64 * kMiB);
  EXPECT_TRUE(store_->direct_io()) << "ext4 under /tmp accepts O_DIRECT";
  for (bool padded : {false, true}) {
    std::vector<NvmeExtent> extents;
    for (int rep = 0; rep < 2; ++rep) {
      for (uint64_t n : kSizes) extents.push_back(Alloc(n));
    }
    RoundTrip(extents, padded, padded ? 100 : 200);
    RoundTrip(extents, padded, padded ? 300 : 400);  // overwrite in place
  }
}

TEST_P(NvmeStoreTest, RequestsInFlightFromSeveralThreadsStayIndependent) {
  OPEN_STORE(64 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<NvmeExtent> extents;
      for (int i = 0; i < 6; ++i) extents.push_back(Alloc(100000 + 4096 * i + t));
      for (int round = 0; round < 3; ++round) RoundTrip(extents, round % 2 == 0, 1000 * t + 10 * round);
    });
  }
  for (auto& th : threads) th.join();
}

TEST_P(NvmeStoreTest, StripesAcrossTwoPaths) {
  TempDir second;
  stripe_bytes_ = 64 * 1024;
  OPEN_STORE(16 * kMiB, {dir_.path(), second.path()});
  ASSERT_EQ(store_->files().file_count(), 2u);
  std::vector<NvmeExtent> extents;
  for (uint64_t n : kSizes) extents.push_back(Alloc(n));
  RoundTrip(extents, false, 7);
  // A 1 MiB + 1 extent spans 17 stripes dealt over both files; check the first stripe of each on disk.
  const NvmeExtent& big = extents[7];
  const std::vector<ExtentPlacement> where = store_->Placement(big);
  ASSERT_GE(where.size(), 17u);
  EXPECT_NE(where[0].path, where[1].path);
  AlignedBuffer want(big.io_bytes());
  FillPattern(want.data(), big.bytes(), 7 + 7);
  uint64_t range_offset = 0;
  for (size_t piece = 0; piece < 3; ++piece) {
    AlignedBuffer got(4096);
    const int fd = open(where[piece].reopen_path.c_str(), O_RDONLY);
    ASSERT_EQ(pread(fd, got.data(), 4096, where[piece].file_offset), 4096);
    close(fd);
    EXPECT_EQ(std::memcmp(got.data(), want.data() + range_offset, 4096), 0) << "stripe " << piece;
    range_offset += where[piece].bytes;
  }
}

TEST_P(NvmeStoreTest, DeepQueueKeepsHundredsOfRequestsInFlight) {
  OPEN_STORE(32 * kMiB, {}, /*depth=*/128);
  std::vector<NvmeExtent> extents;
  for (int i = 0; i < 512; ++i) extents.push_back(Alloc(16384 + (i % 3)));
  RoundTrip(extents, true, 5);
  EXPECT_EQ(queue_->stats().failed_requests, 0u);
}

TEST_P(NvmeStoreTest, ShortTransfersAreResubmittedThroughTheStore) {
  OPEN_STORE(16 * kMiB);
  queue_->SetFaults(IoFaults{.max_bytes_per_io = 8192});
  std::vector<NvmeExtent> extents;
  extents.push_back(Alloc(kMiB + 5));
  RoundTrip(extents, false, 9);
  EXPECT_GE(queue_->stats().resubmits, 2u * 127);
}

TEST_P(NvmeStoreTest, AccountsBytesAndEnforcesTheBudget) {
  budget_ = 3 * kMiB;
  OPEN_STORE(16 * kMiB);
  EXPECT_EQ(store_->capacity_bytes(), 3 * kMiB);
  NvmeExtent a = Alloc(kMiB + 1);  // charged 1 MiB + 4 KiB
  EXPECT_EQ(tracker_.tier(memory::Tier::kNvme).current_bytes, kMiB + 4096);
  EXPECT_EQ(tracker_.kind(memory::Tier::kNvme, memory::Kind::kOptimizerState).current_bytes, kMiB + 4096);
  auto too_big = store_->Allocate(2 * kMiB, memory::Kind::kMaster);
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("tier 'nvme' is out of budget"));
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("master"));
  a.Reset();
  EXPECT_EQ(tracker_.tier(memory::Tier::kNvme).current_bytes, 0u);
  EXPECT_EQ(tracker_.tier(memory::Tier::kNvme).peak_bytes, kMiB + 4096);
  EXPECT_TRUE(store_->Allocate(2 * kMiB, memory::Kind::kMaster).ok());
}

TEST_P(NvmeStoreTest, FlippedByteOnDiskIsDataLossNamingTheExtentAndOthersStillRead) {
  OPEN_STORE(16 * kMiB);
  std::vector<NvmeExtent> extents;
  for (int i = 0; i < 3; ++i) extents.push_back(Alloc(50000));
  RoundTrip(extents, false, 11);
  const ExtentPlacement where = store_->Placement(extents[1])[0];
  const int fd = open(where.reopen_path.c_str(), O_RDWR);
  char byte;
  ASSERT_EQ(pread(fd, &byte, 1, where.file_offset + 1234), 1);
  byte ^= 0x40;
  ASSERT_EQ(pwrite(fd, &byte, 1, where.file_offset + 1234), 1);
  close(fd);
  AlignedBuffer in(50000);
  const absl::Status s = store_->Read(extents[1], in.view()).Wait();
  ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("NVMe extent #", extents[1].id())));
  EXPECT_THAT(std::string(s.message()), HasSubstr(where.path));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("offset ", where.file_offset)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum mismatch"));
  for (int i : {0, 2}) {
    ASSERT_TRUE(store_->Read(extents[i], in.view()).Wait().ok()) << "extent " << i;
    EXPECT_EQ(FirstMismatch(in.data(), 50000, 11 + i), -1);
  }
}

TEST_P(NvmeStoreTest, FailedWriteLeavesTheExtentUnreadableAndOthersIntact) {
  OPEN_STORE(16 * kMiB);
  std::vector<NvmeExtent> extents;
  for (int i = 0; i < 3; ++i) extents.push_back(Alloc(3 * 4096));
  RoundTrip(extents, true, 20);
  queue_->SetFaults(IoFaults{.fail_request = 1, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  AlignedBuffer out(3 * 4096), in(3 * 4096);
  const absl::Status s = store_->Write(extents[1], out.view()).Wait();
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("No space left on device (errno 28)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("writing NVMe extent #", extents[1].id())));
  EXPECT_EQ(store_->Read(extents[1], in.view()).Wait().code(), absl::StatusCode::kFailedPrecondition);
  for (int i : {0, 2}) {
    ASSERT_TRUE(store_->Read(extents[i], in.view()).Wait().ok());
    EXPECT_EQ(FirstMismatch(in.data(), in.bytes(), 20 + i), -1) << "extent " << i;
  }
}

TEST_P(NvmeStoreTest, BufferedFallbackWhenODirectIsRefused) {
  refuse_direct_ = true;
  ::testing::internal::CaptureStderr();
  OPEN_STORE(8 * kMiB);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(store_->direct_io());
  EXPECT_THAT(log, HasSubstr("refuses O_DIRECT; using buffered I/O"));
  std::vector<NvmeExtent> extents;
  for (uint64_t n : kSizes) extents.push_back(Alloc(n));
  RoundTrip(extents, false, 30);
}

TEST_P(NvmeStoreTest, RejectsBadArgumentsWithoutIo) {
  OPEN_STORE(8 * kMiB);
  NvmeExtent e = Alloc(8192);
  AlignedBuffer buf(8192 + 4096);
  EXPECT_EQ(store_->Read(e, buf.view()).Wait().code(), absl::StatusCode::kFailedPrecondition) << "never written";
  memory::BufferView unaligned{buf.data() + 8, 8192, memory::Tier::kPinnedHost};
  EXPECT_EQ(store_->Write(e, unaligned).Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Write(e, buf.view().Slice(0, 100)).Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Write(NvmeExtent(), buf.view()).Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Allocate(0, memory::Kind::kScratch).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(queue_->stats().requests, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreTest, ::testing::ValuesIn(testing::Backends()), testing::BackendParamName);

}  // namespace
}  // namespace strata::offload
