// NvmeFileSet: the per-rank backing files of an NvmeStore, optionally striped over several directories
// (one file per directory, RAID-0 style), and the map from the store's logical byte space to them.
//
// Guarantees. Open() either returns files that are created, sized and (by default) fully preallocated
// with fallocate, so later writes cannot run out of space, or an error naming the path and leaves no
// file behind:
//   - directory missing: NotFound; not a directory: FailedPrecondition; not writable (EACCES, EROFS):
//     PermissionDenied; not enough space for the preallocation: ResourceExhausted naming the path, the
//     bytes needed and the bytes free.
// Files are opened with O_DIRECT; a file system that refuses it (EINVAL) gets buffered I/O and one
// warning naming the path and its file-system type (DirectIo::kRequire makes that an error instead).
// A file system without fallocate (EOPNOTSUPP) gets a sparse file and a warning: writes to it may then
// fail with ENOSPC, which the store reports as ResourceExhausted.
//
// Note [Swap files leave nothing behind]. A file is created as "<dir>/strata-<name>-r<rank>.<index>.<pid>.swap"
// (O_EXCL: two runs never share one), locked (flock) and, once sized, unlinked at once: the open
// descriptor keeps the space, and the kernel returns it when the process ends however it ends (normal
// end, error, SIGINT / SIGTERM, SIGKILL, an MPI abort, the OOM killer). Only two cases leave a name behind:
// keep_files (debugging: the name stays, locked while the set lives, then unlocked, so the next Open in that
// directory after its process has ended reclaims it) and a process killed between the create and the
// unlink. So Open first reclaims, in each of its directories, every "strata-*.swap" file of this user that
// no live process holds locked and whose creator (the pid in its name) no longer runs on this host: a dead
// run's (or an older release's, whose files had names until they were closed), and logs each one it
// removes with its size. The pid check keeps a rank from taking the file another rank on the same host has
// created but not locked yet; a dead run's file whose pid has been reused waits for that process to end.
//
// Striping. The logical space is cut into stripe_bytes units dealt round-robin over the files: unit u
// lives in file u % n at offset (u / n) * stripe_bytes. A range is split at unit boundaries; with one
// file nothing is split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::offload {

enum class DirectIo { kAuto, kRequire, kOff };

// The bytes an unprivileged writer may still use on the file system holding `dir` (statvfs f_bavail), 0 where
// it cannot tell.
uint64_t FreeBytes(const std::string& dir);

struct NvmeFileSetOptions {
  std::vector<std::string> paths;  // directories (NVMe mount points); one file each
  int rank = 0;
  std::string name = "swap";        // distinguishes several stores of one rank
  uint64_t capacity_bytes = 0;      // logical bytes; rounded up to 4096 (and to n x stripe_bytes when striped)
  uint64_t stripe_bytes = 1 << 20;  // a multiple of 4096
  DirectIo direct_io = DirectIo::kAuto;
  bool preallocate = true;              // false: sparse files (tests of ENOSPC during a write)
  bool keep_files = false;              // keep the files' names after the set (debugging; see the Note)
  bool refuse_direct_for_test = false;  // as a file system without O_DIRECT: the file created, then EINVAL
};

// A piece of a logical range inside one file.
struct FilePiece {
  int file = 0;
  uint64_t file_offset = 0;
  uint64_t range_offset = 0;  // where the piece starts within the logical range
  uint64_t bytes = 0;
};

class NvmeFileSet {
 public:
  static constexpr uint64_t kAlignment = 4096;

  static absl::StatusOr<std::unique_ptr<NvmeFileSet>> Open(const NvmeFileSetOptions& options);
  ~NvmeFileSet();  // closes; unlinks a name a failed open left (never a keep_files one)
  NvmeFileSet(const NvmeFileSet&) = delete;
  NvmeFileSet& operator=(const NvmeFileSet&) = delete;

  size_t file_count() const { return files_.size(); }
  const std::string& path(int file) const { return files_[file].path; }  // the name it had (for messages)
  // A path by which this process, or another of this user (fio, a test injecting a fault), opens the file
  // while the set lives: its name when it still has one, else /proc/<pid>/fd/<fd>.
  std::string reopen_path(int file) const;
  int fd(int file) const { return files_[file].fd; }
  bool direct(int file) const { return files_[file].direct; }
  bool all_direct() const;
  const std::string& fs_type(int file) const { return files_[file].fs_type; }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t stripe_bytes() const { return stripe_; }

  // Extends every file so the set holds `capacity_bytes` (rounded as Open rounds it), preallocated as Open
  // preallocates; a smaller capacity changes nothing. Without the room (ENOSPC, EDQUOT): ResourceExhausted naming
  // the path, the bytes asked and the bytes free, and every file is cut back to its size before the call, so the
  // space a partial preallocation took goes back to the file system. Not thread-safe: call it before any I/O maps
  // offsets past the old capacity (the map itself does not depend on the capacity, so I/O below it may go on).
  absl::Status Grow(uint64_t capacity_bytes);

  // Splits logical [offset, offset + bytes) into per-file pieces, in range order.
  std::vector<FilePiece> Map(uint64_t offset, uint64_t bytes) const;

 private:
  struct File {
    std::string path;  // its name while it had one (error messages, keep_files)
    bool named = true;  // false once unlinked
    int fd = -1;
    bool direct = false;
    std::string fs_type;
    bool sparse = false;  // preallocation off, or the file system cannot (sized with ftruncate)
  };
  NvmeFileSet() = default;
  absl::Status OpenOne(const std::string& dir, int index, uint64_t file_bytes, const NvmeFileSetOptions& o);
  // Preallocates (or, where the file system cannot, sizes sparsely) an open file to file_bytes.
  absl::Status Size(File& f, uint64_t file_bytes, const NvmeFileSetOptions& o);
  // The bytes of each of `files` files that hold a logical capacity (rounded to whole stripes over the files).
  static uint64_t FileBytes(uint64_t capacity_bytes, uint64_t files, uint64_t stripe_bytes);

  std::vector<File> files_;
  uint64_t capacity_ = 0;
  uint64_t stripe_ = 0;
  bool keep_files_ = false;
};

// Removes every "strata-*.swap" regular file of this user in `dir` that no live process holds locked and
// whose creator has ended (Note [Swap files leave nothing behind]); returns how many bytes it freed. Logs each file it
// removes.
uint64_t ReclaimStaleSwapFiles(const std::string& dir);

// The file-system type of `path` ("ext4", "tmpfs", "xfs", ... or the magic number in hex).
std::string FileSystemType(const std::string& path);

}  // namespace strata::offload
