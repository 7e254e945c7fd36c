#include "runtime/offload/nvme_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"

namespace strata::offload {
namespace {

absl::Status PathError(const char* call, const std::string& what, const std::string& path) {
  return Annotate(ErrnoError(absl::StrCat(call, "('", path, "')"), errno, __FILE__, __LINE__), what);
}

// NvmeFileSetOptions::refuse_direct_for_test: what open(O_CREAT | O_EXCL | O_DIRECT) does on a file system
// without O_DIRECT (ramfs, tmpfs before Linux 6.6): the file is created, then the open fails with EINVAL.
int RefuseDirectForTest(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags, 0600);
  if (fd < 0) return -1;
  close(fd);
  errno = EINVAL;
  return -1;
}

absl::Status CheckDirectory(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("NVMe path '", dir, "' does not exist (create it, or point nvme_path at ",
                                              "an existing directory)"));
    }
    return PathError("stat", absl::StrCat("NVMe path '", dir, "'"), dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("NVMe path '", dir, "' is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

// The pid in a swap file's name ("strata-<name>-r<rank>.<index>.<pid>.swap", as Open names it), or 0 for
// a name without one (an older release's "strata-<name>-r<rank>.<index>.swap").
pid_t PidInName(const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int64_t pid = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[2], &pid) || pid <= 0 || pid > INT32_MAX) return 0;
  return static_cast<pid_t>(pid);
}

// Whether a process of that pid lives on this host (EPERM: it does, but is another user's).
bool ProcessLives(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

uint64_t ReclaimStaleSwapFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;  // Open reports a missing or unreadable directory itself
  uint64_t freed = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= 12 || name.rfind("strata-", 0) != 0 || name.compare(name.size() - 5, 5, ".swap") != 0) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    // A file whose creator lives is not stale, locked or not: another rank of this job on this host may be
    // between its create and its flock (its unlink follows). Across hosts (a shared file system) the lock
    // alone decides.
    if (ProcessLives(PidInName(name))) continue;
    // Writable: where flock is emulated with fcntl locks (NFS), an exclusive lock needs a writable file.
    const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    // A live run holds its file locked from its creation to its unlink (with keep_files, while its set lives).
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        unlink(path.c_str()) == 0) {
      const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      freed += bytes;
      STRATA_LOG(Warning) << "reclaimed '" << path << "' (" << FormatBytes(bytes)
                          << " on disk): a swap file left behind by a run that did not end normally (killed?)";
    }
    close(fd);
  }
  closedir(d);
  return freed;
}

std::string FileSystemType(const std::string& path) {
  struct statfs s;
  if (statfs(path.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case EXT4_SUPER_MAGIC:
      return "ext4";  // also ext2/ext3: one magic
    case TMPFS_MAGIC:
      return "tmpfs";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlay";
    case NFS_SUPER_MAGIC:
      return "nfs";
    case PROC_SUPER_MAGIC:
      return "proc";
    default:
      return absl::StrCat("0x", absl::Hex(static_cast<unsigned long>(s.f_type)));
  }
}

absl::StatusOr<std::unique_ptr<NvmeFileSet>> NvmeFileSet::Open(const NvmeFileSetOptions& o) {
  if (o.paths.empty()) return absl::InvalidArgumentError("an NVMe store needs at least one path");
  if (o.capacity_bytes == 0) return absl::InvalidArgumentError("an NVMe store needs a capacity above 0 bytes");
  if (o.stripe_bytes == 0 || o.stripe_bytes % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe stripe_bytes ", o.stripe_bytes, " is not a multiple of 4096"));
  }
  std::unique_ptr<NvmeFileSet> set(new NvmeFileSet());
  set->keep_files_ = o.keep_files;
  set->stripe_ = o.stripe_bytes;
  const uint64_t n = o.paths.size();
  const uint64_t file_bytes = FileBytes(o.capacity_bytes, n, o.stripe_bytes);
  set->capacity_ = file_bytes * n;
  for (size_t i = 0; i < o.paths.size(); ++i) {
    STRATA_RETURN_IF_ERROR(set->OpenOne(o.paths[i], static_cast<int>(i), file_bytes, o));
  }
  return set;
}

absl::Status NvmeFileSet::OpenOne(const std::string& dir, int index, uint64_t file_bytes, const NvmeFileSetOptions& o) {
  STRATA_RETURN_IF_ERROR(CheckDirectory(dir));
  ReclaimStaleSwapFiles(dir);
  File f;
  f.path = absl::StrCat(dir, "/strata-", o.name, "-r", o.rank, ".", index, ".", getpid(), ".swap");
  f.fs_type = FileSystemType(dir);
  const std::string what = absl::StrCat("NVMe path '", dir, "'");
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  f.direct = o.direct_io != DirectIo::kOff;
  int fd = -1;
  if (f.direct) {
    fd = o.refuse_direct_for_test ? RefuseDirectForTest(f.path, flags) : open(f.path.c_str(), flags | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
      // Linux creates the file before it refuses O_DIRECT (the check is on the opened file): without this unlink
      // the buffered open below fails with EEXIST (O_EXCL), and a refusal under kRequire leaves the file behind.
      // The name is this process's (its pid), so the file is the one that open just made.
      unlink(f.path.c_str());
      if (o.direct_io == DirectIo::kRequire) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " (", f.fs_type, ") refuses O_DIRECT and direct I/O ", "was required"));
      }
      STRATA_LOG(Warning) << what << " (" << f.fs_type << ") refuses O_DIRECT; using buffered I/O for '" << f.path
                          << "' (swapped data passes through the page cache)";
      f.direct = false;
    }
  }
  if (!f.direct) fd = open(f.path.c_str(), flags, 0600);
  if (fd < 0) {
    const bool denied = errno == EACCES || errno == EROFS || errno == EPERM;
    return PathError("open", denied ? absl::StrCat(what, " is not writable") : what, f.path);
  }
  f.fd = fd;
  files_.push_back(f);  // from here the destructor closes and unlinks it, whatever fails next
  // Live until unlinked: ReclaimStaleSwapFiles of another run skips a locked file. Not fatal when it
  // fails: another run may have reclaimed the name in the instant before the lock (the descriptor still
  // works, and the unlink below then finds no name, which is what it wanted), or the file system has no
  // locks (the name is then unprotected for as long as it exists: until the unlink, or with keep_files).
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno != EWOULDBLOCK) {
    STRATA_LOG(Warning) << what << " (" << f.fs_type << ") refuses flock on '" << f.path << "' (" << strerror(errno)
                        << "); another run could take it for a dead run's file while it still has a name";
  }
  STRATA_RETURN_IF_ERROR(Size(files_.back(), file_bytes, o));
  if (!o.keep_files) {
    if (unlink(f.path.c_str()) != 0 && errno != ENOENT) return PathError("unlink", what, f.path);
    files_.back().named = false;
  }
  return absl::OkStatus();
}

uint64_t NvmeFileSet::FileBytes(uint64_t capacity_bytes, uint64_t files, uint64_t stripe_bytes) {
  return files == 1 ? RoundUp(capacity_bytes, kAlignment) : RoundUp(capacity_bytes, files * stripe_bytes) / files;
}

absl::Status NvmeFileSet::Grow(uint64_t capacity_bytes) {
  const uint64_t old_bytes = capacity_ / files_.size();
  const uint64_t new_bytes = FileBytes(capacity_bytes, files_.size(), stripe_);
  if (new_bytes <= old_bytes) return absl::OkStatus();
  absl::Status grown = absl::OkStatus();
  size_t done = 0;
  for (; done < files_.size() && grown.ok(); ++done) {
    const File& f = files_[done];
    const std::string dir = f.path.substr(0, f.path.rfind('/'));
    const std::string what = absl::StrCat("NVMe path '", dir, "'");
    const off_t from = static_cast<off_t>(old_bytes);
    const off_t more = static_cast<off_t>(new_bytes - old_bytes);
    // Read before the call: other ranks on the disk may take or give back room meanwhile.
    const uint64_t free = f.sparse ? 0 : FreeBytes(dir);
    if (f.sparse) {
      if (ftruncate(f.fd, static_cast<off_t>(new_bytes)) != 0) grown = PathError("ftruncate", what, f.path);
    } else if (fallocate(f.fd, 0, from, more) != 0) {
      grown = errno == ENOSPC || errno == EDQUOT
                  ? absl::ResourceExhaustedError(absl::StrCat(
                        what, " has no room to grow '", f.path, "' by ", FormatBytes(new_bytes - old_bytes), " (",
                        new_bytes - old_bytes, " bytes): fallocate failed with ENOSPC; the file system had ",
                        FormatBytes(free), " free when it was asked"))
                  : PathError("fallocate", what, f.path);
    }
  }
  if (grown.ok()) {
    capacity_ = new_bytes * files_.size();
    return grown;
  }
  // Every file touched, the failed one too, back to its old size; a preallocation that failed part way may have
  // left blocks past the end of the file (XFS keeps them), which the punch gives back.
  for (size_t i = 0; i < done; ++i) {
    const File& f = files_[i];
    static_cast<void>(ftruncate(f.fd, static_cast<off_t>(old_bytes)));
    if (!f.sparse) {
      static_cast<void>(fallocate(f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(old_bytes),
                                  static_cast<off_t>(new_bytes - old_bytes)));
    }
  }
  return grown;
}

absl::Status NvmeFileSet::Size(File& f, uint64_t file_bytes, const NvmeFileSetOptions& o) {
  const int fd = f.fd;
  const std::string dir = f.path.substr(0, f.path.rfind('/'));
  const std::string what = absl::StrCat("NVMe path '", dir, "'");
  if (o.preallocate) {
    if (fallocate(fd, 0, 0, static_cast<off_t>(file_bytes)) == 0) return absl::OkStatus();
    if (errno == ENOSPC || errno == EDQUOT) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " is too small: preallocating ", FormatBytes(file_bytes), " (", file_bytes, " bytes) for '", f.path,
          "' failed with ENOSPC; the file system has ", FormatBytes(FreeBytes(dir)), " free"));
    }
    if (errno != EOPNOTSUPP) return PathError("fallocate", what, f.path);
    STRATA_LOG(Warning) << what << " (" << f.fs_type << ") cannot preallocate; '" << f.path
                        << "' is sparse and a write may fail when the disk fills";
  }
  f.sparse = true;
  if (ftruncate(fd, static_cast<off_t>(file_bytes)) != 0) return PathError("ftruncate", what, f.path);
  return absl::OkStatus();
}

NvmeFileSet::~NvmeFileSet() {
  for (const File& f : files_) {
    if (f.named && !keep_files_) unlink(f.path.c_str());  // a failed open's, before the lock goes
    close(f.fd);
  }
}

std::string NvmeFileSet::reopen_path(int file) const {
  const File& f = files_[file];
  return f.named ? f.path : absl::StrCat("/proc/", getpid(), "/fd/", f.fd);
}

bool NvmeFileSet::all_direct() const {
  return std::all_of(files_.begin(), files_.end(), [](const File& f) { return f.direct; });
}

std::vector<FilePiece> NvmeFileSet::Map(uint64_t offset, uint64_t bytes) const {
  std::vector<FilePiece> pieces;
  const uint64_t n = files_.size();
  if (n == 1) {
    pieces.push_back(FilePiece{0, offset, 0, bytes});
    return pieces;
  }
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t at = offset + done;
    const uint64_t unit = at / stripe_;
    const uint64_t within = at % stripe_;
    const uint64_t len = std::min(bytes - done, stripe_ - within);
    pieces.push_back(FilePiece{static_cast<int>(unit % n), (unit / n) * stripe_ + within, done, len});
    done += len;
  }
  return pieces;
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

}  // namespace strata::offload
