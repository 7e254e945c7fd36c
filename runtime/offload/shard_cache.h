// ShardCache: fixed-size shards that live on NVMe, cached write-through in the buffers of a PinnedPool.
// The engine keeps parameter shards here with offload_param = nvme (Note [NVMe params] in
// runtime/shard/param_source.h): one shard per unit, read ahead of its gather in the recorded order.
//
// Protocol. One owner thread makes every call; a Lease may be released on any thread (the engine's
// gather stream releases it once the all-gather has read the buffer).
//   auto cache = ShardCache::Create(&store, &pool, {bytes of shard 0, bytes of shard 1, ...}, kind);
//   cache->Write(k, fill);               // fill(dst) writes the shard's bytes; the write is then issued
//   cache->Prefetch(k);                  // read-ahead: never blocks, may do nothing
//   Lease l = cache->Pin(k);             // cached, or read now
//   l.ready().Wait(); use l.data() ...   // pinned (never evicted, never overwritten) until l goes
//   cache->Flush();                      // every I/O complete; the first error
//
// Guarantees.
// - Contents: once ready() is OK, data() holds the bytes of the last Write(k) (read back from NVMe, and
//   checksum-verified by the store, when the shard was not cached).
// - Ordering: at most one I/O per shard is in flight. A new read or write of a shard, and any reuse of
//   its buffer, first waits for the previous one. A pinned shard is not written: Write waits for its
//   leases.
// - Eviction: least recently used first (Pin, Prefetch and Write are uses). Prefetch only takes a free
//   buffer or evicts an entry that is unpinned, idle (no I/O in flight) and not itself read ahead and
//   still unused, so read-ahead never throws out read-ahead. Pin and Write may wait: for the I/O of the
//   entry they evict, and, when every buffer is pinned, for a lease to be released. So the pool must
//   hold more buffers than the owner keeps pinned at once (the engine: live gathers + 1).
// - Memory: nothing is allocated after Create; the buffers are the pool's (its tier's budget), the
//   extents are the store's (allocated in Create: ResourceExhausted when the store is short).
//
// Note [Held shards]. Hold(k) gives a second owner of shard k's extent (no I/O, no copy), for a checkpoint's
// snapshot to read on another thread while training goes on (a frozen unit's parameter shard: Note [Frozen
// units in a snapshot] in engine/unit_storage.cc). The extent then keeps the bytes it had: a write of the
// shard (EndWrite, Write) waits until the holder lets go of it, which the holder signals through let_go().
// The engine writes a frozen unit's shard only from SetParam, so training itself never waits. Hold waits for
// the shard's I/O in flight, so the extent holds the last Write; while the extent lacks the newest bytes (the
// shard's last write failed: they are only in the cache's buffer) it returns an error, and the caller copies
// the buffer instead. A never-written shard holds nothing (an empty extent).
//
// Failure. A failed read reaches the lease's ready(); the entry is dropped, so the next Pin reads
// again. A failed write is returned by the call that next waits for it (evicting the entry, writing
// the shard again, or Flush), naming the extent; the cached bytes remain the newest copy: the entry is not
// evicted until a write of them succeeds (an eviction writes them again first, and returns its error).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/offload/io_work.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"

namespace strata::offload {

struct ShardCacheStats {
  uint64_t reads = 0, read_bytes = 0;    // issued to NVMe (demand and read-ahead)
  uint64_t writes = 0, write_bytes = 0;  // issued to NVMe
  uint64_t hits = 0;                     // Pin found the shard cached (or its read-ahead in flight)
  uint64_t misses = 0;                   // Pin had to start the read
};

class ShardCache {
 public:
  class Lease;

  // `store` and `pool` must outlive the cache; every shard must fit one pool buffer.
  static absl::StatusOr<std::unique_ptr<ShardCache>> Create(NvmeStore* store, PinnedPool* pool,
                                                            std::vector<uint64_t> shard_bytes, memory::Kind kind);
  ~ShardCache();  // every Lease must be gone; waits for the I/O in flight (errors are dropped: Flush first)
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  void Prefetch(int shard);
  absl::StatusOr<Lease> Pin(int shard);
  // fill(dst) receives a buffer of bytes(shard) bytes. With keep = true it holds the current contents
  // (read first when not cached), for read-modify-write; otherwise its contents are undefined. The write
  // is issued when fill returns OK; a failing fill leaves the shard as it was.
  absl::Status Write(int shard, const std::function<absl::Status(void* dst)>& fill, bool keep = false);
  // Write in two calls, for a caller that fills the buffer itself: BeginWrite returns the buffer fill would
  // receive; EndWrite(shard, true) issues the write, EndWrite(shard, false) leaves the shard as it was (as
  // a failing fill does). Nothing else may use the shard in between.
  absl::StatusOr<void*> BeginWrite(int shard, bool keep = false);
  void EndWrite(int shard, bool filled);
  // After BeginWrite(shard, keep = true), for a caller that only read the buffer: nothing is written, and the
  // buffer stays cached as it is (after a failed write, the only copy of the newest bytes).
  void EndRead(int shard);
  absl::Status Flush();
  // Note [Held shards].
  absl::StatusOr<NvmeExtent> Hold(int shard);
  NvmeStore* store() const { return store_; }
  const std::shared_ptr<LetGoSignal>& let_go() const { return let_go_; }

  int shards() const { return static_cast<int>(entries_.size()); }
  uint64_t bytes(int shard) const { return entries_[shard].extent.bytes(); }
  bool cached(int shard) const { return !entries_[shard].buffer.empty(); }
  const ShardCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    NvmeExtent extent;
    PinnedBuffer buffer;      // empty: not cached
    IoWork io;                // the last I/O between buffer and extent
    bool io_is_read = false;
    bool read_ahead = false;  // read by Prefetch and not pinned since
    bool written = false;     // the extent holds data (reads of a never-written shard are refused)
    bool failed_write = false;  // the last write failed: the newest bytes are only in `buffer`
    int pins = 0;             // guarded by mu_ (released from other threads)
    uint64_t last_use = 0;
  };
  ShardCache(NvmeStore* store, PinnedPool* pool) : store_(store), pool_(pool) {}
  absl::Status CheckShard(int shard, const char* op) const;
  // A buffer for `shard`: a free one, else an evicted one. may_wait = false: never blocks (an empty buffer
  // when none is free without waiting).
  absl::StatusOr<PinnedBuffer> TakeBuffer(int shard, bool may_wait);
  int PickVictim(int shard, bool may_wait);  // -1 when none
  void StartRead(int shard, PinnedBuffer buffer);
  IoWork WriteBack(Entry& e);  // issues the write of e's buffer to its extent (counted)
  void Unpin(int shard);

  NvmeStore* store_;
  PinnedPool* pool_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  ShardCacheStats stats_;
  std::mutex mu_;
  std::condition_variable unpinned_;
  std::shared_ptr<LetGoSignal> let_go_ = std::make_shared<LetGoSignal>();  // Note [Held shards]
};

// A pinned view of one cached shard (copyable; the pin holds while any copy lives).
class ShardCache::Lease {
 public:
  Lease() = default;
  const void* data() const { return state_->data; }
  uint64_t bytes() const { return state_->bytes; }
  // Completes when data() holds the shard (the read, or nothing when the bytes were already cached).
  const IoWork& ready() const { return state_->ready; }
  bool empty() const { return state_ == nullptr; }
  void Reset() { state_.reset(); }

 private:
  friend class ShardCache;
  struct State {
    ShardCache* cache = nullptr;
    int shard = -1;
    const void* data = nullptr;
    uint64_t bytes = 0;
    IoWork ready;
    ~State() { cache->Unpin(shard); }
  };
  std::shared_ptr<State> state_;
};

}  // namespace strata::offload
