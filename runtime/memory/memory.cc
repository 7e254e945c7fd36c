#include "runtime/memory/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/units.h"

namespace strata::memory {

absl::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kPinnedHost: return "pinned_host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

absl::string_view KindName(Kind k) {
  static constexpr absl::string_view kNames[kNumKinds] = {"param_shard", "grad_shard", "master", "optimizer_state",
                                                         "gathered", "grad_working", "scratch"};
  return kNames[static_cast<int>(k)];
}

// ---- MemoryTracker ----

void MemoryTracker::Bump(std::atomic<uint64_t>& cur, std::atomic<uint64_t>& peak, uint64_t bytes) {
  const uint64_t now = cur.fetch_add(bytes) + bytes;
  uint64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

void MemoryTracker::Add(Tier t, Kind k, uint64_t bytes) {
  const int ti = static_cast<int>(t), ki = static_cast<int>(k);
  Bump(tier_cur_[ti], tier_peak_[ti], bytes);
  Bump(kind_cur_[ti][ki], kind_peak_[ti][ki], bytes);
}

void MemoryTracker::Sub(Tier t, Kind k, uint64_t bytes) {
  const int ti = static_cast<int>(t), ki = static_cast<int>(k);
  tier_cur_[ti].fetch_sub(bytes);
  kind_cur_[ti][ki].fetch_sub(bytes);
}

Usage MemoryTracker::tier(Tier t) const {
  const int ti = static_cast<int>(t);
  return Usage{tier_cur_[ti].load(), tier_peak_[ti].load()};
}

Usage MemoryTracker::kind(Tier t, Kind k) const {
  const int ti = static_cast<int>(t), ki = static_cast<int>(k);
  return Usage{kind_cur_[ti][ki].load(), kind_peak_[ti][ki].load()};
}

void MemoryTracker::ResetPeaks() {
  for (int t = 0; t < kNumTiers; ++t) {
    tier_peak_[t].store(tier_cur_[t].load());
    for (int k = 0; k < kNumKinds; ++k) kind_peak_[t][k].store(kind_cur_[t][k].load());
  }
}

// ---- Buffer ----

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = std::exchange(o.owner_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
  }
  return *this;
}

BufferView Buffer::view() const {
  return BufferView{data_, bytes_, owner_ != nullptr ? owner_->tier() : Tier::kDevice};
}

void Buffer::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, bytes_, kind_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// ---- Allocator ----

Allocator::Allocator(Tier tier, uint64_t budget_bytes, MemoryTracker* tracker)
    : tier_(tier), budget_(budget_bytes), tracker_(tracker) {}

uint64_t Allocator::free_bytes() const {
  const uint64_t used = used_.load();
  return used >= budget_ ? 0 : budget_ - used;
}

absl::StatusOr<Buffer> Allocator::Allocate(size_t bytes, Kind kind, size_t alignment) {
  if (bytes == 0) return Buffer();
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  // Reserve against the budget first, so concurrent allocations cannot both pass the check.
  uint64_t used = used_.load();
  do {
    if (used + bytes > budget_ || used + bytes < used) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tier '", TierName(tier_), "' is out of budget: asked ", FormatBytes(bytes), " (", bytes, " bytes) for ",
          KindName(kind), ", ", FormatBytes(budget_ - std::min(used, budget_)), " free of a ",
          FormatBytes(budget_), " budget"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes));
  void* p = RawAllocate(bytes, alignment);
  if (p == nullptr) {
    used_.fetch_sub(bytes);
    return absl::ResourceExhaustedError(absl::StrCat("tier '", TierName(tier_), "': the system refused ",
                                                     FormatBytes(bytes), " for ", KindName(kind)));
  }
  ZeroFill(p, bytes);
  if (tracker_ != nullptr) tracker_->Add(tier_, kind, bytes);
  return Buffer(this, p, bytes, kind);
}

void Allocator::ZeroFill(void* p, size_t bytes) { std::memset(p, 0, bytes); }

void Allocator::Free(void* p, size_t bytes, Kind kind) {
  // Uncount before releasing the reservation: once used_ drops, another thread may reserve and count
  // the same bytes, and the tracker (whose peak is compared with the budget) must not see them twice.
  if (tracker_ != nullptr) tracker_->Sub(tier_, kind, bytes);
  RawFree(p, bytes);
  used_.fetch_sub(bytes);
}

void* HostAllocator::RawAllocate(size_t bytes, size_t alignment) { return AlignedHostAlloc(bytes, alignment); }

void* AlignedHostAlloc(size_t bytes, size_t alignment) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, bytes) != 0) return nullptr;
  // Note [Huge pages] (offload/pinned_pool.cc): asking for 2 MiB alignment means "back me with huge
  // pages". With transparent_hugepage = madvise (Debian's default) that takes MADV_HUGEPAGE, before the
  // zero fill touches the pages. A hint: refused or unsupported, the pages stay 4 KiB.
  constexpr size_t kHugePage = size_t{2} << 20;
  if (alignment >= kHugePage && bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void HostAllocator::RawFree(void* p, size_t) { std::free(p); }

}  // namespace strata::memory
