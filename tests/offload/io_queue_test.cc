// Tests for offload/io_queue: the same cases on both back-ends (raw requests on a buffered scratch file),
// then back-end selection: the forced fallback is used and named in the log.
#include "runtime/offload/io_queue.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using testing::AlignedBuffer;
using testing::FillPattern;
using testing::FirstMismatch;
using ::testing::HasSubstr;
using testing::TempDir;

class IoQueueTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/queue.bin";
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { close(fd_); }
  IoQueueOptions Options(uint32_t depth = 16) const {
    IoQueueOptions o;
    o.backend = GetParam();
    o.depth = depth;
    o.name = "test";
    return o;
  }
  IoRequest Req(IoOp op, char* data, uint64_t bytes, uint64_t offset) const {
    return IoRequest{op, fd_, path_.c_str(), data, bytes, offset};
  }

  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_P(IoQueueTest, BatchRoundTripsManyRequests) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options(8));
  EXPECT_EQ(q->backend(), GetParam());
  constexpr int kRequests = 40;  // more than the depth: the rest wait in the software queue
  constexpr size_t kBytes = 12345;
  AlignedBuffer out(kRequests * kBytes), in(kRequests * kBytes);
  FillPattern(out.data(), out.bytes(), 1);
  std::vector<IoRequest> writes, reads;
  for (int i = 0; i < kRequests; ++i) {
    writes.push_back(Req(IoOp::kWrite, out.data() + i * kBytes, kBytes, i * kBytes));
    reads.push_back(Req(IoOp::kRead, in.data() + i * kBytes, kBytes, i * kBytes));
  }
  ASSERT_TRUE(q->Submit(writes).Wait().ok());
  ASSERT_TRUE(q->Submit(reads).Wait().ok());
  EXPECT_EQ(FirstMismatch(in.data(), in.bytes(), 1), -1);
  const IoQueueStats s = q->stats();
  EXPECT_EQ(s.requests, 2u * kRequests);
  EXPECT_EQ(s.bytes_written, kRequests * kBytes);
  EXPECT_EQ(s.bytes_read, kRequests * kBytes);
  EXPECT_EQ(s.failed_requests, 0u);
}

TEST_P(IoQueueTest, ShortTransfersAreResubmittedForTheRemainder) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  q->SetFaults(IoFaults{.max_bytes_per_io = 4096});  // every syscall moves at most one page
  AlignedBuffer out(65536 + 100), in(65536 + 100);
  FillPattern(out.data(), out.bytes(), 2);
  ASSERT_TRUE(q->Submit({Req(IoOp::kWrite, out.data(), out.bytes(), 8192)}).Wait().ok());
  ASSERT_TRUE(q->Submit({Req(IoOp::kRead, in.data(), in.bytes(), 8192)}).Wait().ok());
  EXPECT_EQ(FirstMismatch(in.data(), in.bytes(), 2), -1);
  EXPECT_EQ(q->stats().resubmits, 2u * 16);  // 17 syscalls per direction: 16 resubmits
}

TEST_P(IoQueueTest, InjectedErrorNamesFileOffsetAndErrnoAndSparesTheRest) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  q->SetFaults(IoFaults{.fail_request = 2, .fail_errno = ENOSPC, .fail_only = IoOp::kWrite});
  AlignedBuffer out(3 * 4096);
  FillPattern(out.data(), out.bytes(), 3);
  std::vector<IoRequest> batch;
  for (int i = 0; i < 3; ++i) batch.push_back(Req(IoOp::kWrite, out.data() + i * 4096, 4096, i * 4096));
  const absl::Status s = q->Submit(batch).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path_));
  EXPECT_THAT(std::string(s.message()), HasSubstr("offset 4096"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("errno 28"));
  // Requests 1 and 3 of the batch still landed.
  AlignedBuffer in(4096);
  ASSERT_TRUE(q->Submit({Req(IoOp::kRead, in.data(), 4096, 8192)}).Wait().ok());
  EXPECT_EQ(std::memcmp(in.data(), out.data() + 8192, 4096), 0) << "request 3 of the failed batch";
  EXPECT_EQ(q->stats().failed_requests, 1u);
}

TEST_P(IoQueueTest, InterruptedCallsAreRetried) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  q->SetFaults(IoFaults{.fail_request = 1, .fail_errno = EINTR});
  AlignedBuffer out(4096);
  EXPECT_TRUE(q->Submit({Req(IoOp::kWrite, out.data(), 4096, 0)}).Wait().ok());
  EXPECT_EQ(q->stats().resubmits, 1u);
}

TEST_P(IoQueueTest, ReadingPastEndOfFileIsDataLoss) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  AlignedBuffer out(1000), in(4096);
  ASSERT_TRUE(q->Submit({Req(IoOp::kWrite, out.data(), 1000, 0)}).Wait().ok());
  const absl::Status s = q->Submit({Req(IoOp::kRead, in.data(), 4096, 0)}).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("unexpected end of file"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got only 1000"));
}

TEST_P(IoQueueTest, InvalidRequestRejectsTheWholeBatch) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  AlignedBuffer out(4096);
  const absl::Status s =
      q->Submit({Req(IoOp::kWrite, out.data(), 4096, 0), IoRequest{IoOp::kWrite, -1, "x", out.data(), 1, 0}}).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(q->stats().requests, 0u);
  EXPECT_TRUE(q->Submit({}).Wait().ok());  // an empty batch completes at once
}

TEST_P(IoQueueTest, RegisteredBuffersAreUsedWhenSupported) {
  STRATA_MAKE_QUEUE_OR_SKIP(q, Options());
  AlignedBuffer reg(1 << 20), plain(4096);
  ASSERT_TRUE(q->RegisterBuffers({reg.view()}).ok());
  FillPattern(reg.data(), reg.bytes(), 4);
  ASSERT_TRUE(q->Submit({Req(IoOp::kWrite, reg.data(), reg.bytes(), 0)}).Wait().ok());
  ASSERT_TRUE(q->Submit({Req(IoOp::kWrite, plain.data(), 4096, 1 << 20)}).Wait().ok());
  std::memset(reg.data(), 0, reg.bytes());
  ASSERT_TRUE(q->Submit({Req(IoOp::kRead, reg.data(), reg.bytes(), 0)}).Wait().ok());
  EXPECT_EQ(FirstMismatch(reg.data(), reg.bytes(), 4), -1);
  const uint64_t fixed = q->stats().fixed_buffer_ios;
  EXPECT_EQ(fixed, GetParam() == IoBackend::kUring ? 2u : 0u);
  ASSERT_TRUE(q->RegisterBuffers({}).ok());  // unregister
}

TEST_P(IoQueueTest, CallbacksRunOnceAndTheDestructorDrains) {
  std::atomic<int> done{0};
  AlignedBuffer out(64 * 4096);
  {
    STRATA_MAKE_QUEUE_OR_SKIP(q, Options(4));
    for (int i = 0; i < 64; ++i) {
      q->SubmitWithCallback({Req(IoOp::kWrite, out.data() + i * 4096, 4096, i * 4096)}, [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        done.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(done.load(), 64);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoQueueTest, ::testing::ValuesIn(testing::Backends()), testing::BackendParamName);

TEST(IoQueueSelection, ParsesBackendNames) {
  EXPECT_EQ(*ParseIoBackend("threads"), IoBackend::kThreads);
  EXPECT_EQ(*ParseIoBackend("io_uring"), IoBackend::kUring);
  EXPECT_EQ(*ParseIoBackend(""), IoBackend::kAuto);
  EXPECT_EQ(ParseIoBackend("aio").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IoQueueSelection, ThreadsAskedForAreUsedAndNamedInTheLog) {
  ::testing::internal::CaptureStderr();
  auto q = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kThreads, .depth = 4, .name = "forced"});
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ((*q)->backend(), IoBackend::kThreads);
  EXPECT_THAT(log, HasSubstr("I/O queue 'forced': threads depth=4"));
  EXPECT_THAT(log, HasSubstr("pread/pwrite fallback"));
}

TEST(IoQueueSelection, EnvironmentForcesTheFallbackForAuto) {
  ASSERT_EQ(setenv("STRATA_IO_BACKEND", "threads", 1), 0);
  ::testing::internal::CaptureStderr();
  auto q = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kAuto, .depth = 4, .name = "env"});
  const std::string log = ::testing::internal::GetCapturedStderr();
  unsetenv("STRATA_IO_BACKEND");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ((*q)->backend(), IoBackend::kThreads);
  EXPECT_THAT(log, HasSubstr("STRATA_IO_BACKEND=threads"));
  ASSERT_EQ(setenv("STRATA_IO_BACKEND", "bogus", 1), 0);
  auto bad = CreateIoQueue(IoQueueOptions{});
  unsetenv("STRATA_IO_BACKEND");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IoQueueSelection, RefusedRingFlagsAreDroppedOneAtATime) {
  if (!UringCompiledIn()) GTEST_SKIP() << "built without io_uring";
  auto q = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kUring,
                                        .depth = 4,
                                        .sqpoll = true,
                                        .refuse_uring_flags_for_test = 1u << 1 /* IORING_SETUP_SQPOLL */});
  if (!q.ok()) GTEST_SKIP() << "io_uring unavailable: " << q.status();
  EXPECT_THAT((*q)->description(), HasSubstr("refused: sqpoll (EINVAL)"));
  EXPECT_THAT((*q)->description(), HasSubstr("flags=single_issuer"));
}

TEST(IoQueueSelection, UnavailableUringFallsBackToThreadsAndSaysWhy) {
  const IoQueueOptions o{
      .backend = IoBackend::kAuto, .depth = 4, .name = "nouring", .refuse_uring_flags_for_test = ~0u};
  ::testing::internal::CaptureStderr();
  auto q = CreateIoQueue(o);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ((*q)->backend(), IoBackend::kThreads);
  EXPECT_THAT(log, HasSubstr("I/O queue 'nouring': threads depth=4 (pread/pwrite fallback: "));
  if (UringCompiledIn()) {
    EXPECT_THAT(log, HasSubstr("io_uring unavailable: io_uring_queue_init_params(5, flags=none)"));
    EXPECT_THAT(log, HasSubstr("Operation not permitted"));
  } else {
    EXPECT_THAT(log, HasSubstr("this build has no io_uring back-end"));
  }
  // Asking for io_uring explicitly does not fall back silently.
  IoQueueOptions strict = o;
  strict.backend = IoBackend::kUring;
  EXPECT_FALSE(CreateIoQueue(strict).ok());
}

TEST(IoQueueSelection, AutoPrefersUringWhenTheKernelAllowsIt) {
  if (!UringCompiledIn()) GTEST_SKIP() << "built without io_uring";
  auto q = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kAuto, .depth = 4});
  ASSERT_TRUE(q.ok()) << q.status();
  auto uring = CreateIoQueue(IoQueueOptions{.backend = IoBackend::kUring, .depth = 4});
  // Either io_uring works (and auto picked it) or it is refused (and auto fell back).
  EXPECT_EQ((*q)->backend(), uring.ok() ? IoBackend::kUring : IoBackend::kThreads);
  if (uring.ok()) {
    EXPECT_THAT((*uring)->description(), HasSubstr("io_uring depth=4 flags="));
  }
}

}  // namespace
}  // namespace strata::offload
