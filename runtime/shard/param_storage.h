// ParamStorage: host access to a range of a unit's parameter storage wherever it lives (what the unit's
// param buffer holds: its shard at stage 3, the whole unit otherwise), for the update's cast, SetParam,
// initialisation, checkpoints and restores. Where the CPU reaches the buffer the range is handed out in
// place; in device memory it is a host copy of the range, written back through the tier's operations (Note
// [Tier ops] in runtime/memory/tier_ops.h); with parameter shards on NVMe (Note [NVMe params] in
// param_source.h) it is the cache's buffer of the shard, written through. Open and Close are two calls, not
// a callback, so the optimizer's update (optim/memory_state.cc, optim/nvme_state.cc) reaches the params by
// calling down (docs/design.md "Calls only descend").
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/offload/shard_cache.h"

namespace strata::shard {

// One range of one unit's parameter storage.
struct ParamRange {
  memory::TierOps* ops = nullptr;         // the operations of the param buffer's tier
  offload::ShardCache* cache = nullptr;  // with parameter shards on NVMe: their cache (`params` is unused)
  int unit = 0;                          // the cache's shard
  char* params = nullptr;                // the unit's param buffer (without the cache)
  size_t shard_bytes = 0;                // the cache's shard size
  size_t offset = 0, bytes = 0;          // the range, in bytes from the storage's start
};

class ParamStorage {
 public:
  // The range in host memory: in place where the CPU reaches it, else a copy (read first with keep; else
  // its contents are undefined) that Close writes back. With the cache, a part of the shard keeps the rest.
  // One range is open at a time; an empty range is nullptr.
  absl::StatusOr<char*> Open(const ParamRange& range, bool keep);
  // Ends the access to the open range. written: the range holds the new bytes, to be written back (device
  // memory: that range; the cache: the whole shard, through to NVMe); otherwise the storage keeps what it
  // held where it can (the cache drops its buffer, the device is not written).
  absl::Status Close(bool written);
  // Ends the access to a range opened with keep that the caller only read: nothing is written back, and the
  // storage keeps what it holds (the cache keeps its buffer, which may be the only copy of the newest bytes).
  void CloseRead();

 private:
  std::vector<char> scratch_;  // the host copy of a device range, reused
  ParamRange open_;
  bool is_open_ = false;
};

}  // namespace strata::shard
