#include "runtime/memory/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

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

bool Buffer::DiscardToZero() const { return owner_ == nullptr || owner_->DiscardToZero(data_, bytes_); }

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
  // Note [Huge pages] (runtime/offload/pinned_pool.cc): asking for 2 MiB alignment means "back me with huge
  // pages". With transparent_hugepage = madvise (Debian's default) that takes MADV_HUGEPAGE, before the
  // zero fill touches the pages. A hint: refused or unsupported, the pages stay 4 KiB.
  constexpr size_t kHugePage = size_t{2} << 20;
  if (alignment >= kHugePage && bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void HostAllocator::RawFree(void* p, size_t) { std::free(p); }

// Note [Idle pages]
// The engine's buffers are allocated once, for the whole run (docs/design.md "Memory is a contract"), but the
// gradient memory holds nothing from the end of one step to the next backward: the gradient shards (read
// by the step, then zeroed), the gradient working slots and the reduce-scatter's scratch. With
// strata.release_idle_memory the engine hands those bytes back here after each step (Impl::ZeroGrads),
// and once at Finalize together with the gathered pool, which the zero fill made resident and of which a
// slot may never be used: the OS takes their pages, so through the forward the process holds only what is
// live, as a framework that allocates per use does, while the bytes stay reserved under the tier's budget
// and counted by the tracker (budgets, accounting and `strata plan` unchanged). MADV_DONTNEED on private
// anonymous memory (all that posix_memalign returns, from the heap or from mmap) drops the pages; the next
// touch maps a zero page, so the range reads as zero and a gradient shard needs no other clearing.
//
// Cost: a page fault per page at the next use, and the OS may have lent the pages elsewhere by then. The
// gradient memory is then allocated at 2 MiB (Impl::GradAlignment) so those are huge-page faults where
// the kernel allows (Note [Huge pages]). The gathered slots are not handed back per use: they cycle
// through every forward and backward, and with 4 KiB pages a fault per page per use cost 20% of a GPT-2
// step (docs/perf-notes.md, "Idle pages"). Only plain host memory does this: pinned memory is locked for
// DMA, and a buffer registered with io_uring keeps its old pages (the pinned staging pool is never
// handed back).
namespace {
struct WholePages {
  uintptr_t begin, end, first, last;  // the range, and the whole pages [first, last) inside it
};
WholePages WholePagesOf(const void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  const uintptr_t first = (begin + page - 1) & ~(page - 1), last = end & ~(page - 1);
  return {begin, end, first, std::max(first, last)};
}
}  // namespace

Residency ResidentBytes(const void* p, size_t bytes) {
  const WholePages w = WholePagesOf(p, bytes);
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Residency r;
  r.whole = w.last - w.first;
  if (r.whole == 0) return r;
  std::vector<unsigned char> vec(r.whole / page);
  if (mincore(reinterpret_cast<void*>(w.first), r.whole, vec.data()) != 0) return r;
  for (unsigned char v : vec) r.resident += (v & 1) ? page : 0;
  return r;
}

bool HostAllocator::RawDiscardToZero(void* p, size_t bytes) {
  const auto [begin, end, first, last] = WholePagesOf(p, bytes);
  if (first >= last) {  // no whole page inside
    std::memset(p, 0, bytes);
    return true;
  }
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return false;  // untouched
  std::memset(p, 0, first - begin);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  return true;
}

}  // namespace strata::memory
