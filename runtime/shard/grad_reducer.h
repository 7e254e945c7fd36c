// Gradient reduction into shards, on the reduce stream. One implementation per ZeRO family, picked once
// when the engine is finalized:
//   stages 0-1  MakeAllReduceReducer: full gradients accumulate in place over the micro-batches; the last
//               micro-batch all-reduces each unit's gradient once.
//   stages 2-3  MakeReduceScatterReducer: backward accumulates into a pooled working buffer (SlotPool,
//               Note [Gather buffer reuse]); the reduce-scatter writes this rank's part into a scratch
//               shard (then all-reduced across the replica group, with hybrid sharding), which is added
//               to the gradient shard (through pinned staging when the reduction
//               runs in device memory and the shard is in host memory), then the slot is fenced and freed.
//
// With ReduceOps::shards null (strata.optimizer_in_backward) the reduced shard is not added to a
// gradient shard: it stays in the scratch (or its staging copy) and reduced() points at it, for the
// caller to consume after Finish() and before the next Reduce overwrites it.
//
// Protocol: Acquire(u) before backward writes working(u); Reduce(u) after the unit's last backward use of
// a micro-batch in which reduces(last_micro_batch) holds; Finish() before the step reads the shards.
// Every wait on a reduction goes through the communicator's deadline first (the reduce-scatter that last
// read a slot, the last reduction of the step), so a dead peer is an error naming the collective, never a
// wait without end on a device event.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/device/timeline.h"
#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/shard/slot_pool.h"

namespace strata::shard {

struct ReduceUnit {
  std::string name;
  size_t total_elems = 0, shard_elems = 0;
  float* grads = nullptr;  // fp32: the full gradient (stages 0-1) or this rank's shard (stages 2-3)
};

// The tiers a reduction works on (Note [Tier ops] in runtime/memory/tier_ops.h), called directly.
struct ReduceOps {
  // The working buffers' and the scratch's tier (the communicator's memory): Zero of a working buffer on
  // the calling thread, ToHostOn of the scratch into the staging (used only with staging).
  memory::TierOps* working = nullptr;
  // The gradient shards' tier: AccumulateOn(grads += the reduced shard). Null: no gradient shards; the
  // reduced shard is left for reduced().
  memory::TierOps* shards = nullptr;
};

struct ReducerEnv {
  comm::Communicator* comm = nullptr;
  device::Stream* stream = nullptr;
  device::Device* device = nullptr;  // creates the slots' fences
  device::Timeline* timeline = nullptr;
  int64_t* exposed_comm_ns = nullptr;  // what waiting for a reduction is charged to
  // Hybrid sharding (stages 2-3): the replica group, over which each reduce-scattered shard is then
  // all-reduced (summed, as the reduce-scatter sums; the step averages over the world), on the same
  // stream; null when the shard group is the world.
  comm::Communicator* replica_comm = nullptr;
};

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // Does the micro-batch reduce (the last one of the step: last_micro_batch)?
  virtual bool reduces(bool last_micro_batch) const = 0;
  // A zeroed working buffer for the unit's backward (nothing when the gradient itself accumulates).
  virtual absl::Status Acquire(int unit) = 0;
  // Where backward accumulates the unit's full gradient; nullptr between its Reduce and next Acquire.
  virtual float* working(int unit) const = 0;
  virtual absl::Status Reduce(int unit) = 0;
  // The last reduction's shard (fp32, the unit's shard_elems, in the memory the shards' tier would have
  // read) when ReduceOps::shards is null; valid after Finish() until the next Reduce or ReleaseIdle (which hands its
  // pages back: it then reads as zero). nullptr otherwise.
  virtual float* reduced() const { return nullptr; }
  // Waits for every reduction enqueued (the last one's deadline first, then the stream).
  absl::Status Finish();
  // Note [Idle pages]: hands the pages of the free working buffers and of the scratch back to the OS.
  // After Finish(), between steps, and (without gradient shards) once the caller has read reduced().
  virtual void ReleaseIdle() {}

 protected:
  explicit GradReducer(std::vector<ReduceUnit> units, ReducerEnv env) : units_(std::move(units)), env_(env) {}
  // Runs `wait` and charges its duration to the exposed communication time.
  absl::Status TimedWait(const comm::Work& w);
  std::vector<ReduceUnit> units_;
  ReducerEnv env_;
  comm::Work last_;  // the last reduction enqueued
};

std::unique_ptr<GradReducer> MakeAllReduceReducer(std::vector<ReduceUnit> units, ReducerEnv env);

// `pool` holds `max live` working buffers of the largest unit; `scratch` one shard of it in the memory the
// reduce-scatter writes; `staging`, when not empty, a host copy of scratch the shards are added from.
std::unique_ptr<GradReducer> MakeReduceScatterReducer(std::vector<ReduceUnit> units, ReducerEnv env, ReduceOps ops,
                                                      SlotPool pool, memory::Buffer scratch, memory::Buffer staging);

}  // namespace strata::shard
