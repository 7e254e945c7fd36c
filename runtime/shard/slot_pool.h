// A fixed pool of equal-sized buffers for live units: gathered parameters (stage 3) and full-size
// gradient working buffers (stages 2-3). The pool is allocated once, so the peak of live bytes is
// slots x slot_bytes by construction (DESIGN "Memory is a contract"); nothing grows on demand.
//
// Note [Gather buffer reuse]
// A slot returned by Release() may still be read or written by work already enqueued (the compute that
// used the gathered parameters, the reduce-scatter that reads the gradients). Release() therefore takes
// a fence: an event marking the last such use. The next owner orders its first write after the fence:
// a stream does WaitFor(fence) before its gather writes; the host does WaitFence() before it zeroes.
// With host compute the compute is synchronous, so a released parameter slot's fence is already done.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/memory/memory.h"

namespace strata::shard {

class SlotPool {
 public:
  SlotPool() = default;
  // `count` slots of `slot_bytes`, all from `alloc` under `kind`.
  static absl::StatusOr<SlotPool> Create(memory::Allocator& alloc, int count, size_t slot_bytes,
                                         memory::Kind kind);

  // A free slot for `owner`, or -1 when every slot is owned. Not thread-safe (the engine's thread).
  int TryAcquire(int owner);
  // Gives the slot back; `fence` (may be null) marks the last pending use (Note [Gather buffer reuse]).
  void Release(int slot, std::shared_ptr<device::Event> fence);
  // Blocks until the previous owner's fence completed; returns the fence's status.
  absl::Status WaitFence(int slot);
  device::Event* fence(int slot) { return slots_[slot].fence.get(); }

  memory::BufferView view(int slot) const { return slots_[slot].buffer.view(); }
  int owner(int slot) const { return slots_[slot].owner; }
  int size() const { return static_cast<int>(slots_.size()); }
  int live() const;
  size_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Slot {
    memory::Buffer buffer;
    int owner = -1;
    std::shared_ptr<device::Event> fence;
  };
  std::vector<Slot> slots_;
  size_t slot_bytes_ = 0;
};

}  // namespace strata::shard
