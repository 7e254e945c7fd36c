#include "runtime/base/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ErrnoError(absl::string_view call, int err, const char* file, int line) {
  char buf[256];
  // GNU strerror_r returns the message pointer (may not use buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg = absl::StrCat(call, " failed at ", file, ":", line, ": ", text, " (errno ", err, ")");
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES: case EPERM: case EROFS: return absl::PermissionDeniedError(msg);
    case ENOSPC: case ENOMEM: case EDQUOT: return absl::ResourceExhaustedError(msg);
    case EINVAL: return absl::InvalidArgumentError(msg);
    case ETIMEDOUT: return absl::DeadlineExceededError(msg);
    case EAGAIN: case EINTR: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  // Payloads say what kind of failure it is (a peer's notice, a versioned struct): they travel with it.
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

void CheckFailed(const char* expr, const char* file, int line, absl::string_view msg) {
  std::fprintf(stderr, "strata: internal invariant broken at %s:%d: %s %.*s\n", file, line, expr,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace strata
