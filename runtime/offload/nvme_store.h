// NvmeStore: the NVMe tier of one rank. Extents (aligned byte ranges of preallocated, optionally striped
// files; nvme_files.h) are allocated under the tier's byte budget and read and written asynchronously
// through an IoQueue, each returning an IoWork. Every extent carries a CRC-32 of its contents, computed
// when it is written and verified when it is read.
//
// Protocol.
//   auto store = NvmeStore::Create(options, &queue);          // queue outlives the store
//   NvmeExtent e = store->Allocate(bytes, memory::Kind::kOptimizerState);
//   IoWork w = store->Write(e, src);  ...  w.Wait();           // src untouched until then
//   IoWork r = store->Read(e, dst);   ...  r.Wait();           // dst complete and verified
// Buffers: `data` must be 4096-aligned (pinned pool buffers and Allocator(..., 4096) are). A buffer of
// at least IoBytes(e.bytes()) bytes is used directly; a shorter one (down to e.bytes()) is used for the
// aligned body and the last partial block goes through a 4 KiB bounce buffer of the request.
// Ordering: at most one write of an extent in flight, and no read of it while a write is in flight (the
// caller orders them with the IoWorks). Different extents are independent, whatever is in flight.
// Lifetime: destroying an NvmeExtent frees its space once the I/O that uses it has completed. Share() gives
// another owner of the same extent (its space is freed when the last owner and its I/O are gone); an
// extent with more than one owner is read, never written, by convention of its owners (Note [Snapshots of
// NVMe state] in optim/nvme_state.h: a checkpoint's snapshot and the live state). Reads of one extent may
// run at once from different threads.
//
// Accounting. Allocate charges IoBytes(bytes) to memory::Tier::kNvme under (kind) in the tracker and
// against budget_bytes; Free (the extent's destructor) returns it. Out of budget is ResourceExhausted
// naming the tier, bytes asked and bytes free; out of file space (or too fragmented) likewise, naming the
// largest free range. Nothing is allocated then.
//
// Failure. I/O errors name the extent, file, offset and errno (ENOSPC -> ResourceExhausted). A read
// whose bytes fail the checksum is DataLoss naming the extent, its file(s) and offset(s), the stored and
// the computed CRC. Reading an extent that was never written, or whose last write failed, is
// FailedPrecondition. A failed write leaves every other extent untouched.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory/memory.h"
#include "runtime/offload/extent_allocator.h"
#include "runtime/offload/io_queue.h"
#include "runtime/offload/io_work.h"
#include "runtime/offload/nvme_files.h"

namespace strata::offload {

struct NvmeStoreOptions {
  NvmeFileSetOptions files;                    // paths, capacity, striping, O_DIRECT policy
  uint64_t budget_bytes = memory::kUnlimited;  // kNvme budget (the files' capacity bounds it too)
  memory::MemoryTracker* tracker = nullptr;    // kNvme accounting; may be null
};

class NvmeStore;

namespace internal {
struct ExtentRecord;  // offset, sizes, checksum; shared with in-flight I/O
}  // namespace internal

// Owner of one allocated extent (move-only; Share() makes another owner on purpose).
class NvmeExtent {
 public:
  NvmeExtent() = default;
  bool empty() const { return record_ == nullptr; }
  // Another owner of this extent (thread-safe).
  NvmeExtent Share() const { return NvmeExtent(record_); }
  // Whether another owner (or I/O in flight on it) holds this extent too. Called by an owner that made
  // every other owner, false is final: nobody else can hold it again.
  bool shared() const { return record_ != nullptr && record_.use_count() > 1; }
  uint64_t id() const;
  uint64_t bytes() const;     // as asked
  uint64_t io_bytes() const;  // bytes() rounded up to 4096: what is transferred and charged
  void Reset() { record_.reset(); }

 private:
  friend class NvmeStore;
  explicit NvmeExtent(std::shared_ptr<internal::ExtentRecord> r) : record_(std::move(r)) {}
  std::shared_ptr<internal::ExtentRecord> record_;
};

// What the other owners of shared extents signal when they let go of them, for the owner that writes them to
// wait on (Note [Snapshots of NVMe state] in optim/nvme_state.h; Note [Held shards] in shard_cache.h).
// Thread-safe. The waiter reads Seen(), checks the extent, then waits past what it saw, so a let-go between
// the two is not missed.
class LetGoSignal {
 public:
  uint64_t Seen();
  void Notify();  // after letting go
  // Until a let-go after `seen`; every 10 s meanwhile, a warning that it is still `waiting` (what for).
  void WaitPast(uint64_t seen, std::string_view waiting);
  // Whether an owner is waiting in WaitPast now (Note [Cloned checkpoint lanes]: a writer holding tiles for
  // the step's reads to check lets go at once then). Never blocks.
  bool waited_on() const;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  int waiters_ = 0;          // guarded by mu_
  std::atomic<bool> waiters_seen_{false};
};

// Where an extent's bytes lie on disk (tools, fault tests, and the checkpoint writer's clones: Note [Cloned checkpoint
// lanes] in checkpoint/files.h). Thread-safe: an extent's offset and the file set never change once made.
struct ExtentPlacement {
  std::string path;         // the file's name, as errors name it
  std::string reopen_path;  // where it can be opened (NvmeFileSet::reopen_path)
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
};

class NvmeStore {
 public:
  static constexpr uint64_t kAlignment = NvmeFileSet::kAlignment;
  static uint64_t IoBytes(uint64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // Opens the files (see nvme_files.h for the errors). Blocks. `queue` must outlive the store.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Create(const NvmeStoreOptions& options, IoQueue* queue);
  ~NvmeStore();  // every NvmeExtent and every IoWork of this store must be gone / complete first

  // Thread-safe. Does not block on I/O.
  absl::StatusOr<NvmeExtent> Allocate(uint64_t bytes, memory::Kind kind);

  // Non-blocking; thread-safe across different extents. Invalid arguments (empty extent, unaligned or
  // short buffer) give an already-failed IoWork.
  IoWork Write(const NvmeExtent& extent, memory::BufferView src);
  IoWork Read(const NvmeExtent& extent, memory::BufferView dst);

  // Extends the files to hold `capacity_bytes` (NvmeFileSet::Grow: without the room, ResourceExhausted and the store
  // as it was). Not thread-safe against Allocate: call it before the store is shared with other threads.
  absl::Status Grow(uint64_t capacity_bytes);

  uint64_t capacity_bytes() const;  // min(budget, file capacity)
  uint64_t used_bytes() const { return used_.load(); }
  uint64_t free_bytes() const { return capacity_bytes() - used_bytes(); }
  uint64_t largest_free_bytes() const { return extents_.largest_free_bytes(); }
  bool direct_io() const { return files_->all_direct(); }
  const NvmeFileSet& files() const { return *files_; }
  IoQueue& queue() const { return *queue_; }
  std::vector<ExtentPlacement> Placement(const NvmeExtent& extent) const;
  // The CRC-32 of the extent's bytes as last written, or nullopt before a write completed (thread-safe).
  static std::optional<uint32_t> Checksum(const NvmeExtent& extent);
  // Whether a read since the extent's last write found its bytes matching that checksum (thread-safe). An
  // extent shared with a snapshot is never written, so once true it stays true while the snapshot holds it:
  // the live state's read of a tile checks the bytes a checkpoint cloned (Note [Cloned checkpoint lanes]).
  static bool Checked(const NvmeExtent& extent);

 private:
  friend struct internal::ExtentRecord;
  NvmeStore(const NvmeStoreOptions& o, std::unique_ptr<NvmeFileSet> files, IoQueue* queue);
  void Release(const internal::ExtentRecord& r);  // from the record's destructor
  absl::Status CheckArgs(const NvmeExtent& e, const memory::BufferView& buf, const char* op) const;
  std::string Describe(const internal::ExtentRecord& r) const;
  // Requests covering the extent: the first `direct_bytes` from `data`, the rest from `bounce`.
  std::vector<IoRequest> Requests(IoOp op, const internal::ExtentRecord& r, char* data, uint64_t direct_bytes,
                                  char* bounce) const;

  const NvmeStoreOptions options_;
  std::unique_ptr<NvmeFileSet> files_;
  IoQueue* queue_;
  ExtentAllocator extents_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> live_extents_{0};
};

}  // namespace strata::offload
