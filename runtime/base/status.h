// Status propagation and call-site wrappers for foreign calls.
//
// Every fallible call returns absl::Status / absl::StatusOr. Foreign calls (syscalls, MPI, CUDA, ...)
// are wrapped where they happen so the status carries the call text, file:line and the foreign error
// string. STRATA_CHECK is only for broken internal invariants: it aborts with a message.
#pragma once

#include <cerrno>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

// "call" failed at file:line with errno `err`: the message keeps all three and strerror(err).
absl::Status ErrnoError(absl::string_view call, int err, const char* file, int line);

// Prepends context ("while X: ") to a failed status; keeps the code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

[[noreturn]] void CheckFailed(const char* expr, const char* file, int line, absl::string_view msg);

}  // namespace strata

#define STRATA_CONCAT_IMPL_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_IMPL_(a, b)

#define STRATA_RETURN_IF_ERROR(expr)                      \
  do {                                                    \
    ::absl::Status strata_status_ = (expr);               \
    if (!strata_status_.ok()) return strata_status_;      \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_statusor_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

// Wraps a syscall that returns -1 and sets errno.
#define STRATA_SYSCALL(call)                                                 \
  ([&]() -> ::absl::Status {                                                 \
    if ((call) == -1) return ::strata::ErrnoError(#call, errno, __FILE__, __LINE__); \
    return ::absl::OkStatus();                                               \
  }())

#define STRATA_CHECK(cond)                                                   \
  do {                                                                       \
    if (!(cond)) ::strata::CheckFailed(#cond, __FILE__, __LINE__, "");       \
  } while (0)
#define STRATA_CHECK_MSG(cond, msg)                                          \
  do {                                                                       \
    if (!(cond)) ::strata::CheckFailed(#cond, __FILE__, __LINE__, (msg));    \
  } while (0)
