// Tests for runtime/base/status: the propagation macros, the errno -> status mapping of ErrnoError,
// STRATA_SYSCALL (call text, file:line and strerror text kept) and Annotate.
#include "runtime/base/status.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- STRATA_RETURN_IF_ERROR ----

absl::Status ReturnIfErrorTwice(absl::Status first, absl::Status second, int* steps) {
  STRATA_RETURN_IF_ERROR(first);
  ++*steps;
  STRATA_RETURN_IF_ERROR(second);
  ++*steps;
  return absl::OkStatus();
}

TEST(ReturnIfError, ReturnsTheFirstErrorAndStopsThere) {
  int steps = 0;
  const absl::Status s = ReturnIfErrorTwice(absl::NotFoundError("first"), absl::InternalError("second"), &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(), "first");
  EXPECT_EQ(steps, 0) << "code after a failed STRATA_RETURN_IF_ERROR ran";
}

TEST(ReturnIfError, ContinuesPastOkAndReturnsTheLaterError) {
  int steps = 0;
  const absl::Status s = ReturnIfErrorTwice(absl::OkStatus(), absl::DataLossError("second"), &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(steps, 1);
}

TEST(ReturnIfError, FallsThroughWhenEverythingIsOk) {
  int steps = 0;
  EXPECT_TRUE(ReturnIfErrorTwice(absl::OkStatus(), absl::OkStatus(), &steps).ok());
  EXPECT_EQ(steps, 2);
}

TEST(ReturnIfError, EvaluatesTheExpressionExactlyOnce) {
  int calls = 0;
  auto fn = [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR((++calls, absl::OkStatus()));
    return absl::OkStatus();
  };
  ASSERT_TRUE(fn().ok());
  EXPECT_EQ(calls, 1);
}

// ---- STRATA_ASSIGN_OR_RETURN ----

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x, int* steps) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(x));
  ++*steps;
  STRATA_ASSIGN_OR_RETURN(int q, Half(h));
  ++*steps;
  return q;
}

TEST(AssignOrReturn, AssignsTheValueWhenOk) {
  int steps = 0;
  auto q = Quarter(12, &steps);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, 3);
  EXPECT_EQ(steps, 2);
}

TEST(AssignOrReturn, PropagatesTheErrorOfTheFirstFailure) {
  int steps = 0;
  auto q = Quarter(6, &steps);  // 6 -> 3 -> odd
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(), "3 is odd");
  EXPECT_EQ(steps, 1) << "code after the failed STRATA_ASSIGN_OR_RETURN ran";
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(v);
}

absl::StatusOr<int> Unbox(int v) {
  // A move-only value, an existing lvalue as target, and the macro in braces under an `if`.
  std::unique_ptr<int> box;
  if (v != 0) {
    STRATA_ASSIGN_OR_RETURN(box, MakeBox(v));
  } else {
    box = std::make_unique<int>(0);
  }
  return *box + 1;
}

TEST(AssignOrReturn, MovesMoveOnlyValuesIntoExistingVariables) {
  auto r = Unbox(41);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 42);
  auto e = Unbox(-1);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kOutOfRange);
}

// ---- ErrnoError ----

struct ErrnoCase {
  int err;
  absl::StatusCode code;
};

TEST(ErrnoError, MapsErrnoToTheMatchingStatusCode) {
  const std::vector<ErrnoCase> cases = {
      {ENOENT, absl::StatusCode::kNotFound},          {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},   {EROFS, absl::StatusCode::kPermissionDenied},
      {ENOSPC, absl::StatusCode::kResourceExhausted}, {ENOMEM, absl::StatusCode::kResourceExhausted},
      {EDQUOT, absl::StatusCode::kResourceExhausted}, {EINVAL, absl::StatusCode::kInvalidArgument},
      {ETIMEDOUT, absl::StatusCode::kDeadlineExceeded}, {EAGAIN, absl::StatusCode::kUnavailable},
      {EINTR, absl::StatusCode::kUnavailable},        {EIO, absl::StatusCode::kInternal},
      {EBADF, absl::StatusCode::kInternal},
  };
  for (const ErrnoCase& c : cases) {
    const absl::Status s = ErrnoError("op()", c.err, "f.cc", 1);
    EXPECT_EQ(s.code(), c.code) << "errno " << c.err << " (" << std::strerror(c.err) << "): expected "
                                << absl::StatusCodeToString(c.code) << ", actual " << s;
  }
}

TEST(ErrnoError, MessageKeepsCallFileLineAndStrerrorText) {
  const absl::Status s = ErrnoError("pwrite(fd, buf, 4096, 8192)", ENOSPC, "runtime/offload/nvme.cc", 123);
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr("pwrite(fd, buf, 4096, 8192)"));
  EXPECT_THAT(msg, HasSubstr("runtime/offload/nvme.cc:123"));
  EXPECT_THAT(msg, HasSubstr(std::strerror(ENOSPC)));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("errno ", ENOSPC)));
}

// ---- STRATA_SYSCALL ----

TEST(StrataSyscall, ReturnsOkWhenTheCallSucceeds) {
  int fds[2] = {-1, -1};
  const absl::Status s = STRATA_SYSCALL(::pipe(fds));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(STRATA_SYSCALL(::close(fds[0])).ok());
  EXPECT_TRUE(STRATA_SYSCALL(::close(fds[1])).ok());
}

TEST(StrataSyscall, WrapsAFailureWithCallTextFileLineAndErrno) {
  const char* path = "/nonexistent-strata-dir/file";
  const int line = __LINE__ + 1;
  const absl::Status s = STRATA_SYSCALL(::open(path, O_RDONLY));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr("::open(path, O_RDONLY)"));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat(__FILE__, ":", line)));
  EXPECT_THAT(msg, HasSubstr(std::strerror(ENOENT)));
}

TEST(StrataSyscall, EvaluatesTheCallExactlyOnce) {
  int calls = 0;
  auto fake = [&calls](int rc, int err) {
    ++calls;
    errno = err;
    return rc;
  };
  EXPECT_TRUE(STRATA_SYSCALL(fake(0, 0)).ok());
  EXPECT_EQ(calls, 1);
  const absl::Status s = STRATA_SYSCALL(fake(-1, EAGAIN));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(calls, 2);
}

TEST(StrataSyscall, TreatsOnlyMinusOneAsFailure) {
  auto returns = [](int rc) {
    errno = EIO;
    return rc;
  };
  EXPECT_TRUE(STRATA_SYSCALL(returns(7)).ok()) << "a positive return (e.g. bytes read) is success";
  EXPECT_FALSE(STRATA_SYSCALL(returns(-1)).ok());
}

// ---- Annotate ----

TEST(Annotate, PrependsContextAndKeepsTheCode) {
  const absl::Status s = Annotate(absl::NotFoundError("no such file"), "while loading checkpoint step 7");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), StartsWith("while loading checkpoint step 7: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no such file"));
}

TEST(Annotate, NestsOutermostFirst) {
  const absl::Status s = Annotate(Annotate(absl::DataLossError("bad crc"), "reading shard 3"), "loading");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "loading: reading shard 3: bad crc");
}

TEST(Annotate, KeepsThePayloads) {  // what kind of failure it is (a peer's notice) survives the context
  absl::Status inner = absl::AbortedError("rank 1 failed");
  inner.SetPayload("strata.test/kind", absl::Cord("peer"));
  const absl::Status s = Annotate(inner, "gradient reduction");
  ASSERT_TRUE(s.GetPayload("strata.test/kind").has_value());
  EXPECT_EQ(std::string(*s.GetPayload("strata.test/kind")), "peer");
}

TEST(Annotate, LeavesOkAlone) { EXPECT_TRUE(Annotate(absl::OkStatus(), "context").ok()); }

}  // namespace
}  // namespace strata
