#include "runtime/offload/nvme_store.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/crc32.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"

namespace strata::offload {

namespace internal {

// The shared state of one extent. Held by its NvmeExtent and by each I/O in flight on it; the last
// owner returns the space to the store.
struct ExtentRecord {
  NvmeStore* store = nullptr;
  uint64_t id = 0;
  uint64_t offset = 0;  // logical
  uint64_t bytes = 0;
  uint64_t io_bytes = 0;
  memory::Kind kind = memory::Kind::kScratch;
  std::atomic<bool> valid{false};  // holds data whose checksum is `crc`
  std::atomic<uint32_t> crc{0};
  std::atomic<bool> checked{false};  // a read since the last write found its bytes matching `crc`
  ~ExtentRecord() { store->Release(*this); }
};

}  // namespace internal

namespace {

using internal::ExtentRecord;

// Note [Release before completion]. An I/O callback drops its reference to the extent record before it
// completes the IoWork: a caller that waits and then destroys the extent and the store must find nothing
// of the store still in use on the queue thread.

// A 4 KiB aligned block for the last partial block of an extent.
std::shared_ptr<char> MakeBounce() {
  void* p = std::aligned_alloc(NvmeStore::kAlignment, NvmeStore::kAlignment);
  STRATA_CHECK_MSG(p != nullptr, "aligned_alloc(4096) failed");
  std::memset(p, 0, NvmeStore::kAlignment);
  return std::shared_ptr<char>(static_cast<char*>(p), [](char* q) { std::free(q); });
}

}  // namespace

uint64_t NvmeExtent::id() const { return record_ ? record_->id : 0; }
uint64_t NvmeExtent::bytes() const { return record_ ? record_->bytes : 0; }
uint64_t NvmeExtent::io_bytes() const { return record_ ? record_->io_bytes : 0; }

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(const NvmeStoreOptions& options, IoQueue* queue) {
  if (queue == nullptr) return absl::InvalidArgumentError("NvmeStore::Create needs an I/O queue");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<NvmeFileSet> files, NvmeFileSet::Open(options.files));
  return std::unique_ptr<NvmeStore>(new NvmeStore(options, std::move(files), queue));
}

NvmeStore::NvmeStore(const NvmeStoreOptions& o, std::unique_ptr<NvmeFileSet> files, IoQueue* queue)
    : options_(o), files_(std::move(files)), queue_(queue), extents_(files_->capacity_bytes(), kAlignment) {}

NvmeStore::~NvmeStore() {
  STRATA_CHECK_MSG(live_extents_.load() == 0,
                   absl::StrCat("NvmeStore destroyed while ", live_extents_.load(), " extents (or I/Os) still use it"));
}

absl::Status NvmeStore::Grow(uint64_t capacity_bytes) {
  STRATA_RETURN_IF_ERROR(files_->Grow(capacity_bytes));
  extents_.Grow(files_->capacity_bytes());
  return absl::OkStatus();
}

uint64_t NvmeStore::capacity_bytes() const { return std::min(options_.budget_bytes, files_->capacity_bytes()); }

absl::StatusOr<NvmeExtent> NvmeStore::Allocate(uint64_t bytes, memory::Kind kind) {
  if (bytes == 0) return absl::InvalidArgumentError("an NVMe extent needs at least one byte");
  const uint64_t io = IoBytes(bytes);
  const uint64_t limit = capacity_bytes();
  uint64_t used = used_.load();
  do {
    if (used + io > limit || io < bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tier 'nvme' is out of budget: asked ", FormatBytes(io), " (", io, " bytes) for ", memory::KindName(kind),
          ", ", FormatBytes(limit - std::min(used, limit)), " free of a ", FormatBytes(limit), " budget"));
    }
  } while (!used_.compare_exchange_weak(used, used + io));
  absl::StatusOr<uint64_t> offset = extents_.Allocate(io);
  if (!offset.ok()) {
    used_.fetch_sub(io);
    return Annotate(offset.status(), absl::StrCat("allocating ", memory::KindName(kind)));
  }
  if (options_.tracker != nullptr) options_.tracker->Add(memory::Tier::kNvme, kind, io);
  auto r = std::make_shared<ExtentRecord>();
  r->store = this;
  r->id = next_id_.fetch_add(1);
  r->offset = *offset;
  r->bytes = bytes;
  r->io_bytes = io;
  r->kind = kind;
  live_extents_.fetch_add(1);
  return NvmeExtent(std::move(r));
}

void NvmeStore::Release(const ExtentRecord& r) {
  extents_.Free(r.offset, r.io_bytes);
  used_.fetch_sub(r.io_bytes);
  if (options_.tracker != nullptr) options_.tracker->Sub(memory::Tier::kNvme, r.kind, r.io_bytes);
  live_extents_.fetch_sub(1);
}

absl::Status NvmeStore::CheckArgs(const NvmeExtent& e, const memory::BufferView& buf, const char* op) const {
  if (e.empty()) return absl::InvalidArgumentError(absl::StrCat("NVMe ", op, " of an empty extent handle"));
  if (e.record_->store != this) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe ", op, ": extent #", e.id(), " belongs to another store"));
  }
  if (buf.data == nullptr || reinterpret_cast<uintptr_t>(buf.data) % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe ", op, " of extent #", e.id(), ": buffer 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(buf.data)),
                                                   " is not 4096-aligned (needed for O_DIRECT)"));
  }
  if (buf.bytes < e.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe ", op, " of extent #", e.id(), " (", e.bytes(),
                                                   " bytes): buffer holds only ", buf.bytes, " bytes"));
  }
  return absl::OkStatus();
}

std::optional<uint32_t> NvmeStore::Checksum(const NvmeExtent& extent) {
  if (extent.empty() || !extent.record_->valid.load()) return std::nullopt;
  return extent.record_->crc.load();
}

bool NvmeStore::Checked(const NvmeExtent& extent) {
  return !extent.empty() && extent.record_->valid.load() && extent.record_->checked.load();
}

std::vector<ExtentPlacement> NvmeStore::Placement(const NvmeExtent& extent) const {
  std::vector<ExtentPlacement> out;
  if (extent.empty()) return out;
  for (const FilePiece& p : files_->Map(extent.record_->offset, extent.record_->io_bytes)) {
    out.push_back(ExtentPlacement{files_->path(p.file), files_->reopen_path(p.file), p.file_offset, p.bytes});
  }
  return out;
}

std::string NvmeStore::Describe(const ExtentRecord& r) const {
  std::string s = absl::StrCat("NVMe extent #", r.id, " (", r.bytes, " bytes, ", memory::KindName(r.kind), ") at ");
  const std::vector<FilePiece> pieces = files_->Map(r.offset, r.io_bytes);
  for (size_t i = 0; i < pieces.size() && i < 3; ++i) {
    absl::StrAppend(&s, i ? ", " : "", "'", files_->path(pieces[i].file), "' offset ", pieces[i].file_offset);
  }
  if (pieces.size() > 3) absl::StrAppend(&s, " and ", pieces.size() - 3, " more stripes");
  return s;
}

std::vector<IoRequest> NvmeStore::Requests(IoOp op, const ExtentRecord& r, char* data, uint64_t direct_bytes,
                                           char* bounce) const {
  std::vector<IoRequest> out;
  for (const FilePiece& p : files_->Map(r.offset, r.io_bytes)) {
    const uint64_t start = p.range_offset, end = p.range_offset + p.bytes;
    const int fd = files_->fd(p.file);
    const char* name = files_->path(p.file).c_str();
    if (start < direct_bytes) {
      out.push_back(IoRequest{op, fd, name, data + start, std::min(end, direct_bytes) - start, p.file_offset});
    }
    if (end > direct_bytes) {
      const uint64_t s = std::max(start, direct_bytes);
      out.push_back(IoRequest{op, fd, name, bounce + (s - direct_bytes), end - s, p.file_offset + (s - start)});
    }
  }
  return out;
}

IoWork NvmeStore::Write(const NvmeExtent& extent, memory::BufferView src) {
  absl::Status bad = CheckArgs(extent, src, "write");
  if (!bad.ok()) return IoWork::Completed(std::move(bad));
  std::shared_ptr<ExtentRecord> rec = extent.record_;
  char* data = static_cast<char*>(src.data);
  const uint32_t crc = Crc32(data, rec->bytes);
  rec->valid.store(false);  // until this write lands, the old contents are gone
  rec->checked.store(false);
  const uint64_t direct = src.bytes >= rec->io_bytes ? rec->io_bytes : rec->bytes / kAlignment * kAlignment;
  std::shared_ptr<char> bounce;
  if (direct < rec->io_bytes) {
    bounce = MakeBounce();
    std::memcpy(bounce.get(), data + direct, rec->bytes - direct);
  }
  auto promise = std::make_shared<IoPromise>();
  IoWork work = promise->work();
  queue_->SubmitWithCallback(Requests(IoOp::kWrite, *rec, data, direct, bounce.get()),
                             [this, rec, crc, bounce, promise](absl::Status s) mutable {
                               if (s.ok()) {
                                 rec->crc.store(crc);
                                 rec->valid.store(true);
                               }
                               s = Annotate(s, absl::StrCat("writing ", Describe(*rec)));
                               rec.reset();  // Note [Release before completion]
                               promise->Complete(std::move(s));
                             });
  return work;
}

IoWork NvmeStore::Read(const NvmeExtent& extent, memory::BufferView dst) {
  absl::Status bad = CheckArgs(extent, dst, "read");
  if (!bad.ok()) return IoWork::Completed(std::move(bad));
  std::shared_ptr<ExtentRecord> rec = extent.record_;
  if (!rec->valid.load()) {
    return IoWork::Completed(absl::FailedPreconditionError(
        absl::StrCat("reading ", Describe(*rec), ": it holds no data (never written, or its last write failed)")));
  }
  char* data = static_cast<char*>(dst.data);
  const uint64_t direct = dst.bytes >= rec->io_bytes ? rec->io_bytes : rec->bytes / kAlignment * kAlignment;
  std::shared_ptr<char> bounce = direct < rec->io_bytes ? MakeBounce() : nullptr;
  auto promise = std::make_shared<IoPromise>();
  IoWork work = promise->work();
  queue_->SubmitWithCallback(Requests(IoOp::kRead, *rec, data, direct, bounce.get()),
                             [this, rec, data, direct, bounce, promise](absl::Status s) mutable {
                               if (s.ok() && bounce) std::memcpy(data + direct, bounce.get(), rec->bytes - direct);
                               if (s.ok()) {
                                 const uint32_t got = Crc32(data, rec->bytes), want = rec->crc.load();
                                 if (got != want) {
                                   rec->checked.store(false);
                                   s = absl::DataLossError(absl::StrCat("checksum mismatch: stored crc32 0x",
                                                                        absl::Hex(want), ", read 0x", absl::Hex(got)));
                                 } else {
                                   rec->checked.store(true);
                                 }
                               }
                               s = Annotate(s, absl::StrCat("reading ", Describe(*rec)));
                               rec.reset();  // Note [Release before completion]
                               promise->Complete(std::move(s));
                             });
  return work;
}

uint64_t LetGoSignal::Seen() {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void LetGoSignal::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
  }
  cv_.notify_all();
}

void LetGoSignal::WaitPast(uint64_t seen, std::string_view waiting) {
  std::unique_lock<std::mutex> lock(mu_);
  ++waiters_;
  waiters_seen_.store(true);
  while (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return generation_ != seen; })) {
    STRATA_LOG(Warning) << waiting;
  }
  if (--waiters_ == 0) waiters_seen_.store(false);
}

bool LetGoSignal::waited_on() const { return waiters_seen_.load(); }

}  // namespace strata::offload
