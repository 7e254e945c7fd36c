// The byte collectives of communicator.h.
#include "runtime/comm/communicator.h"

#include "runtime/base/status.h"

namespace strata::comm {

Work AllGatherBytes(Communicator& comm, const void* send, void* recv, size_t bytes, device::Stream& stream) {
  STRATA_CHECK_MSG(bytes % 2 == 0, "AllGatherBytes of an odd byte count");
  return comm.AllGather(send, recv, bytes / 2, DType::kF16, stream);
}

Work BroadcastBytes(Communicator& comm, void* buf, size_t bytes, int root, device::Stream& stream) {
  STRATA_CHECK_MSG(bytes % 2 == 0, "BroadcastBytes of an odd byte count");
  return comm.Broadcast(buf, bytes / 2, DType::kF16, root, stream);
}

}  // namespace strata::comm
