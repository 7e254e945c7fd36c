#include "runtime/offload/pinned_pool.h"

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/device/cuda_backend.h"

namespace strata::offload {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2 << 20;

bool HasCapIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

uint64_t LockedBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, "VmLck:")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, "kB");
    uint64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb * 1024;
  }
  return 0;
}

std::string RaiseHint() {
  return "raise it (ulimit -l unlimited; 'memlock' in /etc/security/limits.conf; docker run --ulimit memlock=-1) "
         "or lower buffer_count / buffer_bytes";
}

// Note [Pinning]: see the header.
absl::Status CheckMemlock(uint64_t need) {
  const MemlockInfo m = ReadMemlockInfo();
  if (m.cap_ipc_lock || m.soft_limit_bytes == memory::kUnlimited) return absl::OkStatus();
  const uint64_t room = m.soft_limit_bytes > m.locked_bytes ? m.soft_limit_bytes - m.locked_bytes : 0;
  if (need <= room) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the pinned pool needs ", FormatBytes(need), " (", need, " bytes) of locked memory, but RLIMIT_MEMLOCK is ",
      FormatBytes(m.soft_limit_bytes), " (ulimit -l ", m.soft_limit_bytes / 1024, ") and ", FormatBytes(m.locked_bytes),
      " is already locked; ", RaiseHint()));
}

absl::Status Pin(PinMethod method, void* p, size_t n) {
  switch (method) {
    case PinMethod::kNone:
      return absl::OkStatus();
    case PinMethod::kCudaHostRegister: {
#if STRATA_WITH_CUDA
      // Page-locked and mapped for DMA by the driver: H2D / D2H copies from the pool run at full PCIe
      // rate and asynchronously. The locked-memory limit does not apply to it. Through the CUDA back-end
      // module (runtime/base/module.h), which clears the sticky error of a refusal.
      STRATA_ASSIGN_OR_RETURN(const device::CudaDeviceApi* cuda, device::CudaDeviceBackend());
      const absl::Status s = cuda->host_register(p, n);
      if (s.ok()) return s;
      return absl::FailedPreconditionError(
          absl::StrCat("cudaHostRegister(", FormatBytes(n), ") of the pinned pool failed: ", s.message()));
#else
      return absl::UnimplementedError(
          "PinMethod::kCudaHostRegister needs a CUDA build (STRATA_WITH_CUDA=ON); use kMlock on host builds");
#endif
    }
    case PinMethod::kMlock:
      break;
  }
  STRATA_RETURN_IF_ERROR(CheckMemlock(n));
  if (mlock(p, n) == 0) return absl::OkStatus();
  const int err = errno;
  const MemlockInfo m = ReadMemlockInfo();
  absl::Status s = ErrnoError(absl::StrCat("mlock(", FormatBytes(n), ")"), err, __FILE__, __LINE__);
  const std::string limits = absl::StrCat("RLIMIT_MEMLOCK is ", FormatBytes(m.soft_limit_bytes), ", ",
                                          FormatBytes(m.locked_bytes), " already locked, ", FormatBytes(n), " needed");
  if (err == ENOMEM || err == EPERM) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot lock the pinned pool: ", s.message(), "; ", limits, "; ", RaiseHint()));
  }
  return Annotate(s, limits);
}

void Unpin(PinMethod method, void* p, size_t n) {
  if (method == PinMethod::kMlock) munlock(p, n);
#if STRATA_WITH_CUDA
  if (method != PinMethod::kCudaHostRegister) return;
  // Registered, so the module is loaded.
  if (absl::StatusOr<const device::CudaDeviceApi*> cuda = device::CudaDeviceBackend(); cuda.ok()) {
    (*cuda)->host_unregister(p);
  }
#endif
}

}  // namespace

MemlockInfo ReadMemlockInfo() {
  MemlockInfo m;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    m.soft_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? memory::kUnlimited : static_cast<uint64_t>(rl.rlim_cur);
  }
  m.locked_bytes = LockedBytes();
  m.cap_ipc_lock = HasCapIpcLock();
  return m;
}

absl::StatusOr<std::unique_ptr<PinnedPool>> PinnedPool::Create(const PinnedPoolOptions& o, memory::Allocator* a) {
  if (a == nullptr || a->tier() != memory::Tier::kPinnedHost) {
    return absl::InvalidArgumentError("the pinned pool needs an allocator of tier pinned_host");
  }
  if (o.buffer_count == 0 || o.buffer_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("pinned pool of ", o.buffer_count, " buffers of ", o.buffer_bytes,
                                                   " bytes: both must be at least 1"));
  }
  std::unique_ptr<PinnedPool> pool(new PinnedPool());
  pool->buffer_bytes_ = RoundUp(o.buffer_bytes, kPage);
  const uint64_t total = uint64_t{pool->buffer_bytes_} * o.buffer_count;
  // Note [Huge pages]: a 2 MiB-aligned region lets transparent huge pages back it, so a 1 MiB buffer is
  // one physically contiguous segment; with 4 KiB pages a 1 MiB O_DIRECT request needs 256 segments,
  // more than many virtio / NVMe queues take in one request (virtio-blk here: 254), and is split.
  const size_t alignment = total >= kHugePage ? kHugePage : kPage;
  STRATA_ASSIGN_OR_RETURN(pool->region_, a->Allocate(total, o.kind, alignment));
  STRATA_RETURN_IF_ERROR(Pin(o.pin, pool->region_.data(), total));
  pool->locked_ = o.pin != PinMethod::kNone;
  pool->pin_ = o.pin;
  for (size_t i = 0; i < o.buffer_count; ++i) {
    pool->views_.push_back(pool->region_.view().Slice(i * pool->buffer_bytes_, pool->buffer_bytes_));
    pool->free_.push_back(o.buffer_count - 1 - i);  // hand out index 0 first
  }
  return pool;
}

PinnedPool::~PinnedPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    STRATA_CHECK_MSG(free_.size() == views_.size(),
                     absl::StrCat("pinned pool destroyed with ", views_.size() - free_.size(), " buffers still out"));
  }
  if (locked_) Unpin(pin_, region_.data(), region_.bytes());
}

PinnedBuffer PinnedPool::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  const size_t i = free_.back();
  free_.pop_back();
  return PinnedBuffer(this, i);
}

absl::StatusOr<PinnedBuffer> PinnedPool::TryAcquire() {
  PinnedBuffer b = TryTake();
  if (b.empty()) {
    return absl::UnavailableError(
        absl::StrCat("all ", views_.size(), " pinned buffers of ", FormatBytes(buffer_bytes_), " are in use"));
  }
  return b;
}

PinnedBuffer PinnedPool::TryTake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return PinnedBuffer();
  const size_t i = free_.back();
  free_.pop_back();
  return PinnedBuffer(this, i);
}

size_t PinnedPool::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

void PinnedPool::Return(size_t index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(index);
  }
  cv_.notify_one();
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = o.pool_;
    index_ = o.index_;
    o.pool_ = nullptr;
  }
  return *this;
}

memory::BufferView PinnedBuffer::view() const {
  return pool_ == nullptr ? memory::BufferView{} : pool_->views_[index_];
}

void PinnedBuffer::Reset() {
  if (pool_ != nullptr) pool_->Return(index_);
  pool_ = nullptr;
}

}  // namespace strata::offload
