// Tiers, buffers and allocators with byte budgets (docs/design.md "Memory is a contract", "Tiers are objects").
//
// Every byte the runtime holds comes from an Allocator bound to one Tier and one budget. The
// MemoryTracker counts current and peak bytes per tier and per kind of state, so tests and stats read
// the runtime's own accounting instead of guessing. Allocation beyond a budget fails with
// ResourceExhausted naming the tier, the bytes asked and the bytes free; nothing is allocated then.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace strata::memory {

// On a host-only build kDevice is host memory under its own budget, so every spill path runs in CI.
enum class Tier { kDevice = 0, kPinnedHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;
absl::string_view TierName(Tier t);  // "device", "pinned_host", "nvme"

// What a block of bytes holds; the analytic memory tests sum the sharded kinds.
enum class Kind {
  kParamShard = 0,   // this rank's slice of the parameters, in param dtype (or all of them, stages 0-2)
  kGradShard,        // fp32 gradient shard (or full gradients, stages 0-1)
  kMaster,           // fp32 master weights when param dtype is not fp32
  kOptimizerState,   // Adam m, v / SGD momentum
  kGathered,         // gathered parameters of live units (stage 3)
  kGradWorking,      // full-size gradient buffers of units in backward (stages 2-3)
  kScratch,          // collective staging and other transient buffers
};
inline constexpr int kNumKinds = 7;
absl::string_view KindName(Kind k);

struct Usage {
  uint64_t current_bytes = 0;
  uint64_t peak_bytes = 0;
};

// Thread-safe counters. Peak per tier is the peak of the tier's total, not a sum of per-kind peaks.
class MemoryTracker {
 public:
  void Add(Tier t, Kind k, uint64_t bytes);
  void Sub(Tier t, Kind k, uint64_t bytes);
  Usage tier(Tier t) const;
  Usage kind(Tier t, Kind k) const;
  void ResetPeaks();  // peaks := current

 private:
  static void Bump(std::atomic<uint64_t>& cur, std::atomic<uint64_t>& peak, uint64_t bytes);
  std::array<std::atomic<uint64_t>, kNumTiers> tier_cur_{}, tier_peak_{};
  std::array<std::array<std::atomic<uint64_t>, kNumKinds>, kNumTiers> kind_cur_{}, kind_peak_{};
};

class Allocator;

// A non-owning view of bytes in one tier. Valid while the owning Buffer lives.
struct BufferView {
  void* data = nullptr;
  size_t bytes = 0;
  Tier tier = Tier::kDevice;

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  BufferView Slice(size_t offset_bytes, size_t length_bytes) const {
    return BufferView{static_cast<char*>(data) + offset_bytes, length_bytes, tier};
  }
};

// Move-only owner of an allocation; frees it (and its accounting) on destruction.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { Reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Kind kind() const { return kind_; }
  bool empty() const { return data_ == nullptr; }
  BufferView view() const;
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void Reset();
  // Allocator::DiscardToZero over the whole buffer (an empty buffer: true, nothing to do).
  bool DiscardToZero() const;

 private:
  friend class Allocator;
  Buffer(Allocator* owner, void* data, size_t bytes, Kind kind)
      : owner_(owner), data_(data), bytes_(bytes), kind_(kind) {}
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Kind kind_ = Kind::kScratch;
};

// An allocator for one tier under one byte budget. Allocate/free are thread-safe. The allocator must
// outlive every Buffer it returned.
class Allocator {
 public:
  Allocator(Tier tier, uint64_t budget_bytes, MemoryTracker* tracker);
  virtual ~Allocator() = default;

  // Zero-filled, `alignment`-aligned bytes (alignment a power of two). Zero bytes gives an empty Buffer.
  absl::StatusOr<Buffer> Allocate(size_t bytes, Kind kind, size_t alignment = 64);

  Tier tier() const { return tier_; }
  uint64_t budget_bytes() const { return budget_; }
  uint64_t used_bytes() const { return used_.load(); }
  uint64_t free_bytes() const;

  // Note [Idle pages]. Makes [p, p + bytes) read as zero by handing its whole pages back to the OS (the
  // partial pages at either end are zeroed in place), and returns true; the bytes stay allocated and
  // counted. Where the tier cannot (device and pinned memory), or the OS refuses, it touches nothing and
  // returns false, and the caller keeps the bytes as they are or zeroes them itself. Thread-safe; no other thread may
  // be using the range.
  bool DiscardToZero(void* p, size_t bytes) { return bytes == 0 || RawDiscardToZero(p, bytes); }
  // Whether DiscardToZero hands pages back on this tier.
  virtual bool hands_back_pages() const { return false; }

 protected:
  // Raw memory of the tier; nullptr on failure.
  virtual void* RawAllocate(size_t bytes, size_t alignment) = 0;
  virtual void RawFree(void* p, size_t bytes) = 0;
  // Zero-fills a fresh block (memset for host memory; a device tier overrides it).
  virtual void ZeroFill(void* p, size_t bytes);
  // DiscardToZero for the tier; the default cannot.
  virtual bool RawDiscardToZero(void*, size_t) { return false; }

 private:
  friend class Buffer;
  void Free(void* p, size_t bytes, Kind kind);

  const Tier tier_;
  const uint64_t budget_;
  MemoryTracker* tracker_;
  std::atomic<uint64_t> used_{0};
};

// Plain host memory (posix_memalign), usable for every tier on host-only builds.
class HostAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  bool hands_back_pages() const override { return true; }

 protected:
  void* RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;
  bool RawDiscardToZero(void* p, size_t bytes) override;
};

// posix_memalign of `bytes` at `alignment` (free with std::free), with the huge-page advice for 2 MiB
// alignment (Note [Huge pages] in runtime/offload/pinned_pool.cc); nullptr on failure. What HostAllocator hands out.
void* AlignedHostAlloc(size_t bytes, size_t alignment);

// The resident bytes among the whole pages inside [p, p + bytes) of host memory (mincore), and how many
// bytes those pages hold; for tests and diagnostics of Note [Idle pages]. A page read after being handed
// back may count as resident (the shared zero page), so check before reading.
struct Residency {
  size_t resident = 0, whole = 0;
};
Residency ResidentBytes(const void* p, size_t bytes);

inline constexpr uint64_t kUnlimited = ~uint64_t{0};

}  // namespace strata::memory
