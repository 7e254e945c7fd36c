// The byte collectives of communicator.h.
#include "runtime/comm/communicator.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::comm {

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

uint64_t Traffic::total_bytes() const {
  uint64_t t = 0;
  for (uint64_t b : bytes) t += b;
  return t;
}

Traffic Traffic::operator-(const Traffic& earlier) const {
  Traffic d;
  for (int i = 0; i < kNumCollectives; ++i) {
    d.calls[i] = calls[i] - earlier.calls[i];
    d.bytes[i] = bytes[i] - earlier.bytes[i];
  }
  return d;
}

void TrafficCounter::Add(Collective c, uint64_t bytes) {
  calls_[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
  bytes_[static_cast<int>(c)].fetch_add(bytes, std::memory_order_relaxed);
}

Traffic TrafficCounter::Read() const {
  Traffic t;
  for (int i = 0; i < kNumCollectives; ++i) {
    t.calls[i] = calls_[i].load(std::memory_order_relaxed);
    t.bytes[i] = bytes_[i].load(std::memory_order_relaxed);
  }
  return t;
}

uint64_t PayloadBytes(Collective c, size_t count, DType dtype, int size) {
  const uint64_t bytes = uint64_t{count} * DTypeBytes(dtype);
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return bytes * static_cast<uint64_t>(size);
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return bytes;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

Work AllGatherBytes(Communicator& comm, const void* send, void* recv, size_t bytes, device::Stream& stream) {
  STRATA_CHECK_MSG(bytes % 2 == 0, "AllGatherBytes of an odd byte count");
  return comm.AllGather(send, recv, bytes / 2, DType::kF16, stream);
}

Work BroadcastBytes(Communicator& comm, void* buf, size_t bytes, int root, device::Stream& stream) {
  STRATA_CHECK_MSG(bytes % 2 == 0, "BroadcastBytes of an odd byte count");
  return comm.Broadcast(buf, bytes / 2, DType::kF16, root, stream);
}

bool IsPeerFailure(const absl::Status& s) { return s.GetPayload(kPeerFailurePayload).has_value(); }

absl::Status PeerFailure(const std::string& what, int sender, const std::string& cause_message) {
  absl::Status s = absl::AbortedError(absl::StrCat(what, " abandoned: rank ", sender,
                                                   " failed and will not join it: ", cause_message));
  s.SetPayload(kPeerFailurePayload, absl::Cord(std::to_string(sender)));
  return s;
}

}  // namespace strata::comm
