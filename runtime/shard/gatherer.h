// The stage-3 parameter gather: a pool of gathered buffers (SlotPool, Note [Gather buffer reuse]), the
// gather communicator and stream, and a ParamSource that says where each shard comes from. The engine
// owns the protocol (which unit is gathered when, from the order schedule.h records); the Gatherer owns the
// mechanics, the same for every placement.
//
//   Issue(u, demand)  takes a free slot, has the source prepare the shard and enqueues the all-gather;
//                     a read-ahead (demand = false) without a free slot, or whose shard is not ready, is
//                     not issued. A demand gather without a free slot is ResourceExhausted naming the holders.
//   Ensure(u)         issues when needed and waits: the source's read first, the gather, then its copies.
//   Prefetch(upcoming, read_ahead)  read-ahead gathers of `upcoming`, then the source's reads of `read_ahead`.
//   Release(u)        gives the slot back (host compute is synchronous: no fence is needed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/base/dtype.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/timeline.h"
#include "runtime/shard/param_source.h"
#include "runtime/shard/slot_pool.h"

namespace strata::shard {

struct GatherUnit {
  std::string name;
  size_t shard_elems = 0;
};

struct GathererOptions {
  comm::Communicator* comm = nullptr;
  device::Stream* stream = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  device::Timeline* timeline = nullptr;
  int64_t* exposed_comm_ns = nullptr;  // what waiting for a gather is charged to
};

class Gatherer {
 public:
  // `pool`'s slots hold a whole gathered unit each; `source` is where the shards come from.
  Gatherer(SlotPool pool, std::vector<GatherUnit> units, std::unique_ptr<ParamSource> source, GathererOptions o);
  ~Gatherer();
  // Waits for the work the source enqueued on its own streams (the engine drains before buffers go).
  void Drain() { source_->Drain(); }

  absl::Status Issue(int unit, bool demand);
  absl::Status IssueIfNeeded(int unit) { return slot_[unit] < 0 ? Issue(unit, /*demand=*/true) : absl::OkStatus(); }
  absl::Status Ensure(int unit);
  // A failed read-ahead gather is dropped; the demand gather of that unit reports it.
  void Prefetch(absl::Span<const int> upcoming, absl::Span<const int> read_ahead);
  void Release(int unit);

  // The gathered unit, or nullptr when it is not gathered.
  char* data(int unit) const {
    return slot_[unit] < 0 ? nullptr : static_cast<char*>(pool_.view(slot_[unit]).data);
  }
  bool gathered(int unit) const { return slot_[unit] >= 0; }
  int read_ahead_depth() const { return source_->read_ahead_depth(); }

 private:
  SlotPool pool_;
  std::vector<GatherUnit> units_;
  std::unique_ptr<ParamSource> source_;
  GathererOptions o_;
  std::vector<int> slot_;          // per unit: its gathered buffer, or -1
  std::vector<comm::Work> work_;   // per unit: the pending gather into its slot
};

}  // namespace strata::shard
