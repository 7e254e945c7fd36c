// PinnedPool: a fixed set of equal-size, page-locked host staging buffers, handed out and returned
// (DeepSpeed's pinned swap buffers, with a budget).
//
// Guarantees. All memory is allocated once, in Create, from a memory::Allocator of tier kPinnedHost, so it
// is charged to that tier's budget and MemoryTracker (kind `kind`) and never exceeds it: a pool that does
// not fit is ResourceExhausted naming the tier, bytes asked and bytes free, before anything is locked.
// Each buffer is 4096-aligned and buffer_bytes (rounded up to 4096) long, so it serves O_DIRECT I/O of
// any extent up to that size, and buffers() can be registered with IoQueue::RegisterBuffers.
//
// Locking (Note [Pinning]). On host builds the pages are locked with mlock. Before locking, the need is
// checked against RLIMIT_MEMLOCK (minus what the process has locked already, VmLck) unless the process
// holds CAP_IPC_LOCK (root normally does; the limit does not apply to it): too little is
// FailedPrecondition naming the limit, the need and how to raise it. mlock's own ENOMEM / EPERM get the
// same kind of message. PinMethod::kCudaHostRegister (CUDA builds; Unimplemented otherwise) registers
// the region with cudaHostRegister instead, so device copies from it are asynchronous DMA; its failure is
// FailedPrecondition with the CUDA error text. PinMethod::kNone skips locking (tests, or hosts that forbid it).
//
// Threads. Acquire / TryAcquire / returning a PinnedBuffer are thread-safe. The pool must outlive every
// PinnedBuffer; its destructor unlocks and frees.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory/memory.h"

namespace strata::offload {

enum class PinMethod { kMlock, kCudaHostRegister, kNone };

struct PinnedPoolOptions {
  size_t buffer_count = 4;
  size_t buffer_bytes = 64 << 20;  // rounded up to 4096
  memory::Kind kind = memory::Kind::kScratch;
  PinMethod pin = PinMethod::kMlock;
};

class PinnedPool;

// A lease on one buffer; returns it to the pool on destruction (move-only).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : pool_(o.pool_), index_(o.index_) { o.pool_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  bool empty() const { return pool_ == nullptr; }
  size_t index() const { return index_; }
  memory::BufferView view() const;
  void* data() const { return view().data; }
  size_t bytes() const { return view().bytes; }
  void Reset();

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, size_t index) : pool_(pool), index_(index) {}
  PinnedPool* pool_ = nullptr;
  size_t index_ = 0;
};

class PinnedPool {
 public:
  // `allocator` must be of tier kPinnedHost and outlive the pool. Blocks (allocates, zero-fills, locks).
  static absl::StatusOr<std::unique_ptr<PinnedPool>> Create(const PinnedPoolOptions& options,
                                                            memory::Allocator* allocator);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Blocks until a buffer is free. Deadlocks if the caller itself holds every buffer: size the pool
  // (buffer_count) for every concurrent user.
  PinnedBuffer Acquire();
  // Unavailable naming the pool size when every buffer is out.
  absl::StatusOr<PinnedBuffer> TryAcquire();
  // An empty buffer when every buffer is out (no error to build: for callers that poll).
  PinnedBuffer TryTake();

  size_t buffer_count() const { return views_.size(); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t free_count() const;
  bool locked() const { return locked_; }
  // Every buffer, in index order (for IoQueue::RegisterBuffers).
  const std::vector<memory::BufferView>& buffers() const { return views_; }

 private:
  friend class PinnedBuffer;
  PinnedPool() = default;
  void Return(size_t index);

  memory::Buffer region_;
  size_t buffer_bytes_ = 0;
  bool locked_ = false;
  PinMethod pin_ = PinMethod::kNone;
  std::vector<memory::BufferView> views_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> free_;  // indices, LIFO (a returned buffer is the next one handed out: warm in cache)
};

// Locked-memory facts used by the check (exposed for `strata doctor`-style reports and tests).
struct MemlockInfo {
  uint64_t soft_limit_bytes = 0;  // RLIMIT_MEMLOCK (kUnlimited when RLIM_INFINITY)
  uint64_t locked_bytes = 0;      // VmLck of this process
  bool cap_ipc_lock = false;      // the limit does not apply
};
MemlockInfo ReadMemlockInfo();

}  // namespace strata::offload
