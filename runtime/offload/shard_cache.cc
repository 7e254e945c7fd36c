#include "runtime/offload/shard_cache.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"

namespace strata::offload {

absl::StatusOr<std::unique_ptr<ShardCache>> ShardCache::Create(NvmeStore* store, PinnedPool* pool,
                                                                std::vector<uint64_t> shard_bytes,
                                                                memory::Kind kind) {
  std::unique_ptr<ShardCache> c(new ShardCache(store, pool));
  c->entries_ = std::vector<Entry>(shard_bytes.size());
  for (size_t i = 0; i < shard_bytes.size(); ++i) {
    if (shard_bytes[i] > pool->buffer_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", i, " of ", FormatBytes(shard_bytes[i]),
                                                     " does not fit a pinned buffer of ",
                                                     FormatBytes(pool->buffer_bytes())));
    }
    STRATA_ASSIGN_OR_RETURN(c->entries_[i].extent, store->Allocate(std::max<uint64_t>(shard_bytes[i], 1), kind));
  }
  return c;
}

ShardCache::~ShardCache() {
  for (Entry& e : entries_) e.io.Wait().IgnoreError();  // buffers and extents are released after their I/O
}

absl::Status ShardCache::CheckShard(int shard, const char* op) const {
  if (shard < 0 || shard >= shards()) {
    return absl::OutOfRangeError(absl::StrCat("ShardCache::", op, "(", shard, "): ", shards(), " shards"));
  }
  return absl::OkStatus();
}

void ShardCache::Unpin(int shard) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --entries_[shard].pins;
  }
  unpinned_.notify_all();
}

// Least recently used among the entries that may give up their buffer now. Without waiting, only idle
// entries qualify, and read-ahead that has not been used yet is kept.
int ShardCache::PickVictim(int shard, bool may_wait) {
  std::lock_guard<std::mutex> lock(mu_);
  int best = -1;
  for (int i = 0; i < shards(); ++i) {
    const Entry& e = entries_[i];
    if (i == shard || e.buffer.empty() || e.pins > 0) continue;
    if (!may_wait && (e.read_ahead || !e.io.Done() || e.failed_write)) continue;  // no write without waiting
    // Unused read-ahead goes last: it was fetched because it is needed soon.
    const auto rank = [](const Entry& x) { return std::make_pair(x.read_ahead, x.last_use); };
    if (best < 0 || rank(e) < rank(entries_[best])) best = i;
  }
  return best;
}

absl::StatusOr<PinnedBuffer> ShardCache::TakeBuffer(int shard, bool may_wait) {
  while (true) {
    if (PinnedBuffer free = pool_->TryTake(); !free.empty()) return free;
    const int victim = PickVictim(shard, may_wait);
    if (victim >= 0) {
      Entry& v = entries_[victim];
      absl::Status s = v.io.Wait();  // the buffer is the I/O's source or target until then
      v.io = IoWork();
      // A failed write: the shard's newest bytes are only in the buffer, which stays (reported once; the next
      // eviction writes them again first).
      if (!s.ok() && !v.io_is_read) {
        v.failed_write = true;
        return s;
      }
      if (v.failed_write) {
        STRATA_RETURN_IF_ERROR(WriteBack(v).Wait());
        v.failed_write = false;
      }
      v.read_ahead = false;
      return std::move(v.buffer);
    }
    if (!may_wait) return PinnedBuffer();  // none without waiting
    // Every buffer is pinned (by gathers in flight): wait for a lease to go.
    std::unique_lock<std::mutex> lock(mu_);
    unpinned_.wait(lock, [&] {
      for (int i = 0; i < shards(); ++i) {
        if (i != shard && !entries_[i].buffer.empty() && entries_[i].pins == 0) return true;
      }
      return pool_->free_count() > 0;
    });
  }
}

void ShardCache::StartRead(int shard, PinnedBuffer buffer) {
  Entry& e = entries_[shard];
  e.buffer = std::move(buffer);
  memory::BufferView dst = e.buffer.view();
  dst.bytes = NvmeStore::IoBytes(e.extent.bytes());
  e.io = e.written ? store_->Read(e.extent, dst)
                   : IoWork::Completed(absl::FailedPreconditionError(
                         absl::StrCat("ShardCache: shard ", shard, " was read before it was ever written")));
  e.io_is_read = true;
  ++stats_.reads;
  stats_.read_bytes += e.extent.bytes();
}

void ShardCache::Prefetch(int shard) {
  if (!CheckShard(shard, "Prefetch").ok() || cached(shard) || !entries_[shard].written) return;
  absl::StatusOr<PinnedBuffer> b = TakeBuffer(shard, /*may_wait=*/false);
  if (!b.ok() || b->empty()) return;  // read-ahead is best effort
  StartRead(shard, std::move(b).value());
  entries_[shard].read_ahead = true;
  entries_[shard].last_use = ++clock_;
}

absl::StatusOr<ShardCache::Lease> ShardCache::Pin(int shard) {
  STRATA_RETURN_IF_ERROR(CheckShard(shard, "Pin"));
  Entry& e = entries_[shard];
  // A cached entry whose read failed is dropped and read again (the error may have been transient).
  if (!e.buffer.empty() && e.io_is_read && e.io.Done() && !e.io.Wait().ok()) {
    e.buffer.Reset();
    e.io = IoWork();
  }
  if (e.buffer.empty()) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, TakeBuffer(shard, /*may_wait=*/true));
    StartRead(shard, std::move(b));
    ++stats_.misses;
  } else {
    ++stats_.hits;
  }
  e.read_ahead = false;
  e.last_use = ++clock_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++e.pins;
  }
  Lease l;
  l.state_ = std::make_shared<Lease::State>();
  l.state_->cache = this;
  l.state_->shard = shard;
  l.state_->data = e.buffer.data();
  l.state_->bytes = e.extent.bytes();
  if (e.io_is_read) l.state_->ready = e.io;  // after a write the buffer already holds the bytes
  return l;
}

absl::Status ShardCache::Write(int shard, const std::function<absl::Status(void* dst)>& fill, bool keep) {
  STRATA_ASSIGN_OR_RETURN(void* dst, BeginWrite(shard, keep));
  const absl::Status s = fill(dst);
  EndWrite(shard, s.ok());
  return s;
}

absl::StatusOr<void*> ShardCache::BeginWrite(int shard, bool keep) {
  STRATA_RETURN_IF_ERROR(CheckShard(shard, "Write"));
  Entry& e = entries_[shard];
  {
    std::unique_lock<std::mutex> lock(mu_);
    unpinned_.wait(lock, [&] { return e.pins == 0; });  // gathers still reading the old bytes
  }
  if (keep && e.buffer.empty() && e.written) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, TakeBuffer(shard, /*may_wait=*/true));
    StartRead(shard, std::move(b));
  }
  const absl::Status previous = e.io.Wait();  // one I/O per shard; the buffer is free after it
  e.io = IoWork();
  if (!previous.ok() && !e.io_is_read) {  // reported once; the buffer keeps the newest bytes
    e.failed_write = true;
    return previous;
  }
  if (!previous.ok() && keep) {  // a failed read left garbage, and the contents were to be kept
    e.buffer.Reset();
    return previous;
  }
  if (e.buffer.empty()) {
    STRATA_ASSIGN_OR_RETURN(e.buffer, TakeBuffer(shard, /*may_wait=*/true));
  }
  e.last_use = ++clock_;
  e.read_ahead = false;
  return e.buffer.data();
}

void ShardCache::EndWrite(int shard, bool filled) {
  Entry& e = entries_[shard];
  if (!filled) {
    e.buffer.Reset();  // possibly half-filled: the extent keeps the last written bytes
    return;
  }
  // Note [Held shards]: a snapshot holds the extent (the shard's own I/O is complete: BeginWrite waited).
  while (e.extent.shared()) {
    const uint64_t seen = let_go_->Seen();
    if (!e.extent.shared()) break;
    let_go_->WaitPast(seen,
                      "a write of a parameter shard is waiting for the checkpoint being written to read "
                      "past it");
  }
  e.io = WriteBack(e);
  e.io_is_read = false;
  e.written = true;
  e.failed_write = false;  // until a wait sees this write fail
}

IoWork ShardCache::WriteBack(Entry& e) {
  memory::BufferView src = e.buffer.view();
  src.bytes = NvmeStore::IoBytes(e.extent.bytes());
  ++stats_.writes;
  stats_.write_bytes += e.extent.bytes();
  return store_->Write(e.extent, src);
}

void ShardCache::EndRead(int shard) { entries_[shard].last_use = ++clock_; }

absl::StatusOr<NvmeExtent> ShardCache::Hold(int shard) {
  STRATA_RETURN_IF_ERROR(CheckShard(shard, "Hold"));
  Entry& e = entries_[shard];
  const absl::Status last = e.io.Wait();
  if (!last.ok() && !e.io_is_read) return last;  // left to be reported by the call that next waits for it too
  if (e.failed_write) {
    return absl::FailedPreconditionError(
        absl::StrCat("ShardCache: shard ", shard, "'s last write failed; its newest bytes are only in memory"));
  }
  if (!e.written) return NvmeExtent();
  return e.extent.Share();
}

absl::Status ShardCache::Flush() {
  absl::Status first;
  for (Entry& e : entries_) {
    const absl::Status s = e.io.Wait();
    if (!s.ok() && !e.io_is_read) e.failed_write = true;
    first.Update(s);
  }
  return first;
}

}  // namespace strata::offload
