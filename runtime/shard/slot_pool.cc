#include "runtime/shard/slot_pool.h"

#include <algorithm>

#include "runtime/base/status.h"

namespace strata::shard {

uint64_t SlotPlan::elems() const {
  uint64_t n = uint64_t(shared) * shared_elems;
  for (const SlotUnit& u : own) n += u.elems;
  return n;
}

SlotPlan PlanSlots(std::vector<SlotUnit> units, int live) {
  SlotPlan plan;
  plan.live = live;
  if (units.empty() || live <= 0) return plan;
  std::stable_sort(units.begin(), units.end(), [](const SlotUnit& a, const SlotUnit& b) { return a.elems < b.elems; });
  // Candidate i: shared slots of units[i].elems; the units after the last of that size get their own.
  uint64_t above = 0;  // the elements of units[end..)
  uint64_t best = UINT64_MAX;
  size_t best_end = units.size();
  for (size_t end = units.size(); end > 0;) {
    const size_t size = units[end - 1].elems;
    const uint64_t cost = uint64_t(std::min<size_t>(live, end)) * size + above;
    if (cost < best) best = cost, best_end = end;  // strict: a tie keeps the larger shared size
    while (end > 0 && units[end - 1].elems == size) above += units[--end].elems;
  }
  plan.shared = static_cast<int>(std::min<size_t>(live, best_end));
  plan.shared_elems = units[best_end - 1].elems;
  plan.own.assign(units.begin() + best_end, units.end());
  return plan;
}

absl::StatusOr<SlotPool> SlotPool::Create(memory::Allocator& alloc, const SlotPlan& plan, size_t elem_bytes,
                                          memory::Kind kind, size_t alignment) {
  SlotPool pool;
  pool.shared_ = plan.shared;
  pool.limit_ = plan.live;
  auto add = [&](size_t elems) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(memory::Buffer b, alloc.Allocate(elems * elem_bytes, kind, alignment));
    pool.slots_.push_back(Slot{std::move(b), -1, nullptr});
    return absl::OkStatus();
  };
  for (int i = 0; i < plan.shared; ++i) STRATA_RETURN_IF_ERROR(add(plan.shared_elems));
  for (const SlotUnit& u : plan.own) {
    if (u.unit >= static_cast<int>(pool.own_slot_.size())) pool.own_slot_.resize(u.unit + 1, -1);
    pool.own_slot_[u.unit] = pool.size();
    STRATA_RETURN_IF_ERROR(add(u.elems));
  }
  return pool;
}

int SlotPool::TryAcquire(int owner) {
  if (live() >= limit_) return -1;
  auto take = [&](int slot) {
    slots_[slot].owner = owner;
    slots_[slot].resident = true;  // from here on it is the owner's, whatever its pages
    return slot;
  };
  if (owner < static_cast<int>(own_slot_.size()) && own_slot_[owner] >= 0) {
    const int slot = own_slot_[owner];
    if (slots_[slot].owner >= 0) return -1;  // already owned (the callers acquire a unit once)
    return take(slot);
  }
  for (int i = 0; i < shared_; ++i) {
    if (slots_[i].owner < 0) return take(i);
  }
  return -1;
}

void SlotPool::Release(int slot, std::shared_ptr<device::Event> fence) {
  slots_[slot].owner = -1;
  slots_[slot].fence = std::move(fence);
}

void SlotPool::ReleaseIdle() {
  for (Slot& s : slots_) {
    if (s.owner >= 0 || !s.resident || (s.fence != nullptr && !s.fence->Query())) continue;
    // A device or pinned tier cannot: the slot then simply stays as it is (Note [Idle pages]).
    s.buffer.DiscardToZero();
    s.resident = false;
  }
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

std::vector<int> SlotPool::owners() const {
  std::vector<int> out;
  for (const Slot& s : slots_) {
    if (s.owner >= 0) out.push_back(s.owner);
  }
  return out;
}

}  // namespace strata::shard
