// Durable file operations for checkpoints: every write goes to a temporary name, is fsynced, renamed
// into place, and the directory is fsynced, so a crash leaves either the old file or the new one. A
// temporary is owned by a TempFile, which unlinks it on every path that does not commit it.
//
// Note [Confined names]: a checkpoint comes from other people and machines, so every file name read from
// it (a manifest's shard file) is a single plain path component, checked when parsed
// (CheckPlainFileName), and is opened only through OpenInDir: openat2(RESOLVE_BENEATH) on the step
// directory, so neither "..", an absolute path nor a symlink can reach outside it. Where the kernel has
// no openat2 (ENOSYS, or a seccomp filter answering EPERM), the fallback opens the single component
// with O_NOFOLLOW, which refuses every symlink.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::checkpoint {

// An open file descriptor, closed on destruction (CONVENTIONS 2: one owner per resource).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// A temporary file's path, unlinked on destruction unless Commit() was called (after its rename).
class TempFile {
 public:
  TempFile() = default;
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile();
  TempFile(TempFile&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempFile& operator=(TempFile&& o) noexcept;
  const std::string& path() const { return path_; }
  void Commit() { path_.clear(); }

 private:
  std::string path_;
};

// OK when `path` may be replaced by renaming a finished temporary over it: it does not exist, or it is a
// regular file or a symlink (the link is replaced, its target is left alone), or a directory (rename()
// itself refuses that). A FIFO, device or socket there is FailedPrecondition naming it: rename() would
// silently put a regular file in the place of /dev/full or a pipe.
absl::Status CheckReplaceable(const std::string& path);

// The temporary name of `path` for this process: "<path>.tmp.<pid>".
std::string TempName(const std::string& path);

absl::StatusOr<Fd> OpenForWrite(const std::string& path);  // O_CREAT | O_TRUNC
absl::StatusOr<Fd> OpenForRead(const std::string& path);

// OK when `name` is one plain path component: not empty, no '/', not "." or "..", no NUL, at most 255
// bytes. Otherwise InvalidArgument saying why (the caller names the field).
absl::Status CheckPlainFileName(absl::string_view name);
// Opens `name` (read-only) inside directory `dir`, never outside it (Note [Confined names]). A name
// that is not plain, or that resolves outside `dir` (a symlink), is PermissionDenied naming both.
absl::StatusOr<Fd> OpenInDir(const std::string& dir, const std::string& name);
// The fallback of OpenInDir without openat2 (O_NOFOLLOW on the single component); public for tests.
absl::StatusOr<Fd> OpenInDirNoFollow(const std::string& dir, const std::string& name);
// Reads the whole of `name` in `dir` (OpenInDir); a file over `max_bytes` is ResourceExhausted.
absl::StatusOr<std::string> ReadFileInDir(const std::string& dir, const std::string& name, uint64_t max_bytes);
// Removes the files in `dir` whose names contain ".tmp." and satisfy `pick` (temporaries an earlier,
// dead writer left); returns the names removed.
absl::StatusOr<std::vector<std::string>> RemoveTemps(const std::string& dir,
                                                     const std::function<bool(absl::string_view)>& pick);
absl::Status WriteAt(int fd, const void* data, size_t n, uint64_t offset, const std::string& path);

// Note [Direct checkpoint writes]. A checkpoint's bytes are written once and never read back by the writer, so
// the page cache only costs: buffered, the kernel copies every byte into it, then writes it back and reclaims it.
// Measured on this project's host (docs/perf-notes.md "Checkpoint writes with O_DIRECT"): 4 GiB written by dd
// took 7-9 s of system CPU and 1.2-1.8 s of kernel threads buffered, against 0.5-0.8 s and 0.2-0.35 s with
// O_DIRECT, and 23-24 s of wall time against 4.3-5.4 s; a save beside training takes that CPU from the step
// (decision 0054).
// StreamFile, which writes checkpoint shard files (ShardWriter) and exported safetensors (SafetensorsWriter),
// writes a file's body, a stream of bytes from `start` on, with O_DIRECT: bytes that continue the
// stream are gathered in one aligned buffer and written in whole blocks of kDirectAlign; the last partial block
// is written padded and the file cut back to the stream's end. A file system that refuses O_DIRECT (EINVAL at the
// open, as tmpfs before Linux 6.6, or at a write), or a write anywhere but the stream's end (a header written last,
// ranges out of order), turns the file buffered for good, after writing what is pending: the file's bytes are the same
// either way.
class StreamFile {
 public:
  StreamFile() = default;  // no file
  StreamFile(StreamFile&& o) noexcept { *this = std::move(o); }
  StreamFile& operator=(StreamFile&& o) noexcept;  // `o` is left with no file and nothing pending
  static constexpr uint64_t kDirectAlign = 4096;
  static constexpr size_t kBufferBytes = size_t{4} << 20;
  // Creates `path` (O_CREAT | O_TRUNC); the stream starts at `start`, a multiple of kDirectAlign. `direct`
  // false: buffered from the start (tests). `buffer_bytes`, a multiple of kDirectAlign, for tests.
  static absl::StatusOr<StreamFile> Create(const std::string& path, uint64_t start, bool direct = true,
                                           size_t buffer_bytes = kBufferBytes);
  // Writes n bytes at `offset` (see the Note for which are gathered).
  absl::Status Write(const void* data, size_t n, uint64_t offset);
  // Writes what is pending; the file is buffered from then on. Errors name the file.
  absl::Status Flush();
  // Writes what is pending and continues the stream at `at` (>= the stream's end): the bytes in between are
  // written some other way (a clone: CloneRange). Direct only while the stream's end and `at` are whole blocks.
  absl::Status Resume(uint64_t at);
  // Closes the file (without Flush), reporting close's error; no file afterwards.
  absl::Status Close();
  bool direct() const { return direct_; }
  int fd() const { return fd_.get(); }

 private:
  struct Unmap {   // the buffer is its own mapping, so its pages go back to the system when the file is done
    size_t bytes;  // no initializer here: a nested class's would make it not default-constructible until the end
    void operator()(char* p) const;
  };
  absl::Status TurnBuffered();         // clears O_DIRECT after writing what is pending
  absl::Status WriteBlocks(size_t n);  // writes buffer_[0, n) at pending_at_, n a multiple of kDirectAlign

  std::string path_;
  Fd fd_;
  bool direct_ = false;
  std::unique_ptr<char, Unmap> buffer_;
  size_t buffer_bytes_ = 0, pending_ = 0;  // buffer_[0, pending_) belongs at pending_at_
  uint64_t pending_at_ = 0;                // a multiple of kDirectAlign while direct
};
// Note [Cloned checkpoint lanes]. (docs/decisions/0057-cloned-checkpoint-lanes.md) On a file system that shares
// blocks between files (XFS with reflink, btrfs), a shard file's NVMe lanes (Note [NVMe lanes laid out as tiles] in
// shard_file.h) are not copied from the held tiles but cloned: FICLONERANGE makes the file's blocks those of the NVMe
// files, with no data read or written, and the step's next write of such a block is copied on write by the file
// system. CloneRange clones n bytes (whole blocks of both files) from `src` at `src_offset` to `dst` at
// `dst_offset`. Where the file systems cannot (EOPNOTSUPP, EXDEV: another file system, EINVAL: not whole blocks,
// ENOTTY), it returns Unimplemented and changed nothing, and the caller copies the bytes instead; any other error
// (EIO, ENOSPC) is the write's error, naming both files.
// Without the read-back (docs/decisions/0058-cloned-tiles-checked-by-the-steps.md): the writer knows each tile's CRC
// from the NVMe store, so a range's CRC is spliced from it (crc32.h's Crc32Middle) and from the few pieces of the
// tile read back (all but its largest piece: ShardWriter::CloneTile). That the cloned bytes are the CRC's is checked
// by whoever reads them next: the step after the save reads every tile it rewrites through the store, which checks
// it (NvmeStore::Checked), and the writer holds each tile until then; a tile nobody will check (the live state wrote
// it elsewhere unread, or waits for room; the training waits for the save; or no tile was checked for a minute) is
// read back from the file and checked there. A corrupt tile so still fails the save, with DataLoss.
// A clone's blocks take their room when the steps rewrite them, so a save clones only where its file system has
// room for every clone that will land there: those of every rank whose shard goes to the same file system of the
// same host (checkpoint::SharedCloneRoom, one all-gather per save over the saver's communicator); else it streams,
// and a disk without that room fails the save, not the steps (docs/decisions/0059-nvme-room-agreed.md).
absl::Status CloneRange(int src, const std::string& src_path, uint64_t src_offset, int dst, const std::string& dst_path,
                        uint64_t dst_offset, uint64_t n);
// Reads exactly n bytes; a short read (truncated file) is DataLoss naming the file and offset.
absl::Status ReadAt(int fd, void* data, size_t n, uint64_t offset, const std::string& path);
absl::Status Fsync(int fd, const std::string& path);
absl::Status FsyncDir(const std::string& dir);
absl::Status RenameDurably(const std::string& from, const std::string& to);  // rename + fsync of the dir
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes);
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::StatusOr<uint64_t> FileSize(const std::string& path);
absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path);
absl::Status MakeDirs(const std::string& dir);

}  // namespace strata::checkpoint
