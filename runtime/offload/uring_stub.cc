// Stands in for uring_queue.cc when the build has no io_uring back-end (STRATA_WITH_URING=OFF or
// liburing not found): CreateIoQueue then always uses the thread pool, and says why in its log line.
#include "runtime/offload/io_queue_internal.h"

namespace strata::offload::internal {

absl::StatusOr<std::unique_ptr<IoQueue>> CreateUringQueue(const IoQueueOptions&) {
  return absl::UnavailableError("this build has no io_uring back-end (STRATA_WITH_URING=OFF or liburing not found)");
}

}  // namespace strata::offload::internal

namespace strata::offload {
bool UringCompiledIn() { return false; }
}  // namespace strata::offload
