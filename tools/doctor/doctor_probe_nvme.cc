// `strata doctor --nvme-path DIR`: a short sequential bandwidth test of the disk under DIR, and the free bytes
// of the disks the job's NVMe stores are on.
//
// Protocol: statvfs (use at most a quarter of the free space, at least 16 MiB; a disk with less than 64 MiB
// free is not measured, and the facts say why: the test is a speed, the job's fit is CheckNvmeSpace's),
// create a temporary file with O_DIRECT (falling back to buffered I/O when the file system refuses it),
// unlink it at once so nothing is left behind whatever happens next, write 4 MiB aligned blocks then
// fdatasync (timed together), drop the page cache for the file when buffered, read the blocks back (timed). Each
// direction stops after `max_seconds`, so a slow disk costs seconds, not minutes. The data is a
// non-zero pattern so compressing or deduplicating devices do not flatter the numbers.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "tools/doctor/doctor_probe.h"

namespace strata::tools::doctor {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBlockBytes = 4 << 20;
constexpr uint64_t kMinBytes = 16 << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// The scratch file's descriptor, closed on destruction.
class ScratchFd {
 public:
  explicit ScratchFd(int fd) : fd_(fd) {}
  ~ScratchFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScratchFd(ScratchFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ScratchFd& operator=(ScratchFd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

absl::Status Errno(const char* call, const std::string& path) {
  return Annotate(ErrnoError(call, errno, __FILE__, __LINE__), path);
}

// One whole block at `offset`: short transfers are resumed, EINTR retried; end of file is DataLoss.
absl::Status Transfer(bool write, int fd, char* block, uint64_t offset, const std::string& dir) {
  uint64_t done = 0;
  while (done < kBlockBytes) {
    const off_t at = static_cast<off_t>(offset + done);
    const ssize_t n =
        write ? pwrite(fd, block + done, kBlockBytes - done, at) : pread(fd, block + done, kBlockBytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(write ? "pwrite" : "pread", dir);
    if (n == 0) return absl::DataLossError(absl::StrCat(dir, ": scratch file ended at offset ", offset + done));
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Opens a fresh file under dir, O_DIRECT when accepted, and unlinks it (the fd keeps it alive).
absl::StatusOr<ScratchFd> OpenScratch(const std::string& dir, bool* direct) {
  const std::string path = absl::StrCat(dir, "/.strata-doctor-", getpid(), ".tmp");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open", path);
  ScratchFd owned(fd);
  if (unlink(path.c_str()) != 0) return Errno("unlink", path);
  return owned;
}

// Writes blocks until `bytes` or the deadline; returns the bytes written (synced).
absl::StatusOr<uint64_t> TimedWrite(int fd, char* block, uint64_t bytes, double max_s, const std::string& dir,
                                    double* secs) {
  const auto t0 = Clock::now();
  uint64_t done = 0;
  while (done < bytes && (done == 0 || Since(t0) < max_s)) {
    STRATA_RETURN_IF_ERROR(Transfer(true, fd, block, done, dir));
    done += kBlockBytes;
  }
  if (fdatasync(fd) != 0) return Errno("fdatasync", dir);
  *secs = Since(t0);
  return done;
}

absl::StatusOr<uint64_t> TimedRead(int fd, char* block, uint64_t bytes, double max_s, const std::string& dir,
                                   double* secs) {
  const auto t0 = Clock::now();
  uint64_t done = 0;
  while (done < bytes && (done == 0 || Since(t0) < max_s)) {
    STRATA_RETURN_IF_ERROR(Transfer(false, fd, block, done, dir));
    done += kBlockBytes;
  }
  *secs = Since(t0);
  return done;
}

absl::Status RunTest(const std::string& dir, uint64_t max_bytes, double max_s, NvmeFacts* out) {
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) return Errno("statvfs", dir);
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t bytes = std::min(max_bytes, free_bytes / 4) / kBlockBytes * kBlockBytes;
  if (bytes < kMinBytes) {
    // Not an error: the disk may still hold the job (CheckNvmeSpace says), and filling it to measure it would
    // leave nothing for anything else writing there.
    out->skipped_reason = absl::StrCat("not measured: ", FormatBytes(free_bytes), " (", free_bytes,
                                       " bytes) free, and the test writes at most a quarter of the free space and at "
                                       "least ",
                                       FormatBytes(kMinBytes), ", so it needs ", FormatBytes(4 * kMinBytes), " free");
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(ScratchFd fd, OpenScratch(dir, &out->direct_io));
  std::unique_ptr<char, FreeDeleter> block;
  {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, kBlockBytes) != 0) return absl::ResourceExhaustedError("posix_memalign(4 MiB)");
    block.reset(static_cast<char*>(p));
  }
  for (uint64_t i = 0; i < kBlockBytes; ++i) block.get()[i] = static_cast<char>((i * 2654435761u) >> 13);
  double write_s = 0, read_s = 0;
  STRATA_ASSIGN_OR_RETURN(const uint64_t written, TimedWrite(fd.get(), block.get(), bytes, max_s, dir, &write_s));
  if (!out->direct_io) posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);  // best effort: read from the disk
  STRATA_ASSIGN_OR_RETURN(const uint64_t read, TimedRead(fd.get(), block.get(), written, max_s, dir, &read_s));
  out->test_bytes = written;
  out->write_bytes_per_s = double(written) / std::max(write_s, 1e-9);
  out->read_bytes_per_s = double(read) / std::max(read_s, 1e-9);
  return absl::OkStatus();
}

}  // namespace

void ProbeNvmeSpace(NvmeSpaceFacts* s) {
  std::vector<NvmeDiskFacts> disks;
  std::vector<dev_t> devices;  // st_dev of each of `disks`: one file system, one entry
  for (NvmeDiskFacts& d : s->disks) {
    struct stat st;
    struct statvfs vfs;
    if (stat(d.path.c_str(), &st) != 0) {
      d.error = std::string(Errno("stat", d.path).message());
    } else if (statvfs(d.path.c_str(), &vfs) != 0) {
      d.error = std::string(Errno("statvfs", d.path).message());
    } else {
      d.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      const auto same = std::find(devices.begin(), devices.end(), st.st_dev);
      if (same != devices.end()) {  // two directories of one file system: their stores take the same free bytes
        NvmeDiskFacts& into = disks[static_cast<size_t>(same - devices.begin())];
        absl::StrAppend(&into.path, ", ", d.path);
        absl::StrAppend(&into.stores, " + ", d.stores);
        into.need_per_rank += d.need_per_rank;
        into.room_per_rank += d.room_per_rank;
        continue;
      }
    }
    devices.push_back(d.error.empty() ? st.st_dev : dev_t(-1));
    disks.push_back(std::move(d));
  }
  s->disks = std::move(disks);
}

NvmeFacts ProbeNvme(const std::string& dir, uint64_t max_bytes, double max_seconds) {
  NvmeFacts n;
  n.path = dir;
  const absl::Status s = RunTest(dir, max_bytes, max_seconds, &n);
  if (!s.ok()) n.error = std::string(s.message());
  return n;
}

}  // namespace strata::tools::doctor
