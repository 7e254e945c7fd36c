#include "runtime/shard/slot_pool.h"

#include "runtime/base/status.h"

namespace strata::shard {

absl::StatusOr<SlotPool> SlotPool::Create(memory::Allocator& alloc, int count, size_t slot_bytes,
                                          memory::Kind kind) {
  SlotPool pool;
  pool.slot_bytes_ = slot_bytes;
  for (int i = 0; i < count; ++i) {
    STRATA_ASSIGN_OR_RETURN(memory::Buffer b, alloc.Allocate(slot_bytes, kind));
    pool.slots_.push_back(Slot{std::move(b), -1, nullptr});
  }
  return pool;
}

int SlotPool::TryAcquire(int owner) {
  for (int i = 0; i < size(); ++i) {
    if (slots_[i].owner < 0) {
      slots_[i].owner = owner;
      return i;
    }
  }
  return -1;
}

void SlotPool::Release(int slot, std::shared_ptr<device::Event> fence) {
  slots_[slot].owner = -1;
  slots_[slot].fence = std::move(fence);
}

absl::Status SlotPool::WaitFence(int slot) {
  if (slots_[slot].fence == nullptr) return absl::OkStatus();
  return slots_[slot].fence->Synchronize();
}

int SlotPool::live() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.owner >= 0;
  return n;
}

}  // namespace strata::shard
