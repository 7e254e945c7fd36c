// A fixed pool of buffers for live units: gathered parameters (stage 3) and full-size gradient working
// buffers (stages 2-3). The pool is allocated once, so the peak of live bytes is the pool's bytes by
// construction (docs/design.md "Memory is a contract"); nothing grows on demand.
//
// Note [Slot sizing]
// At most `live` units hold a slot at once (strata.max_live_units), in any combination. The pool is
// `shared` equal slots of `shared_elems` elements, which any unit of at most that size takes, plus one slot
// of its own size for each larger unit (PlanSlots): every set of at most `live` units then fits, exactly
// as with `live` slots of the largest unit, so no schedule that ran before fails now, while a unit much
// larger than the rest (a GPT's tied embedding, 5.6x a block of GPT-2) is held once instead of `live`
// times. `shared_elems` is the unit size that makes the pool smallest (ties: the larger size, so equal
// units keep `live` slots of the largest). The engine's accounting (runtime/engine/accounting.cc) sizes the
// pool with the same plan.
//
// Note [Gather buffer reuse]
// A slot returned by Release() may still be read or written by work already enqueued (the compute that
// used the gathered parameters, the reduce-scatter that reads the gradients). Release() therefore takes
// a fence: an event marking the last such use. The next owner orders its first write after the fence:
// a stream does WaitFor(fence) before its gather writes; the host does WaitFence() before it zeroes.
// With host compute the compute is synchronous, so a released parameter slot's fence is already done.
//
// ReleaseIdle() hands the pages of the free slots whose fences are done back to the OS (Note [Idle
// pages], runtime/memory/memory.cc); a slot with an owner is never handed back, whatever fence was
// pending when it was taken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/memory/memory.h"

namespace strata::shard {

// The unit that takes a slot, and its size in elements.
struct SlotUnit {
  int unit;
  size_t elems;
};

// Note [Slot sizing].
struct SlotPlan {
  int live = 0;             // at most this many units hold a slot at once
  int shared = 0;           // slots of shared_elems, for the units of at most that size
  size_t shared_elems = 0;
  std::vector<SlotUnit> own;  // the larger units: a slot each, of their own size
  uint64_t elems() const;     // the pool's size in elements
};

// `units`: every unit that may take a slot; at most `live` hold one at a time.
SlotPlan PlanSlots(std::vector<SlotUnit> units, int live);

class SlotPool {
 public:
  SlotPool() = default;
  // The slots of `plan`, `elem_bytes` per element, all from `alloc` under `kind`.
  static absl::StatusOr<SlotPool> Create(memory::Allocator& alloc, const SlotPlan& plan, size_t elem_bytes,
                                         memory::Kind kind, size_t alignment = 64);
  // `count` equal slots of `slot_bytes`, any `count` of them owned at once.
  static absl::StatusOr<SlotPool> Create(memory::Allocator& alloc, int count, size_t slot_bytes, memory::Kind kind) {
    return Create(alloc, SlotPlan{count, count, slot_bytes, {}}, 1, kind);
  }

  // A free slot for `owner`, or -1 when `limit()` units already own one. Not thread-safe (the engine's
  // thread).
  int TryAcquire(int owner);
  // Gives the slot back; `fence` (may be null) marks the last pending use (Note [Gather buffer reuse]).
  void Release(int slot, std::shared_ptr<device::Event> fence);
  // Blocks until the previous owner's fence completed; returns the fence's status.
  absl::Status WaitFence(int slot);
  // Note [Idle pages]: hands back every free slot whose fence is done now.
  void ReleaseIdle();
  device::Event* fence(int slot) { return slots_[slot].fence.get(); }

  memory::BufferView view(int slot) const { return slots_[slot].buffer.view(); }
  int owner(int slot) const { return slots_[slot].owner; }
  int size() const { return static_cast<int>(slots_.size()); }  // slots, shared and own
  int limit() const { return limit_; }                              // units that may own a slot at once
  int live() const;
  std::vector<int> owners() const;  // the units owning a slot, in slot order

 private:
  struct Slot {
    memory::Buffer buffer;
    int owner = -1;
    std::shared_ptr<device::Event> fence;
    bool resident = true;  // owned, or free and not handed back since
  };
  std::vector<Slot> slots_;  // the shared slots, then the own ones
  int shared_ = 0, limit_ = 0;
  std::vector<int> own_slot_;  // per unit: its own slot, or -1 (it takes a shared one)
};

}  // namespace strata::shard
