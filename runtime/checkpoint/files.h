// Durable file operations for checkpoints: every write goes to a temporary name, is fsynced, renamed
// into place, and the directory is fsynced, so a crash leaves either the old file or the new one.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

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

absl::StatusOr<Fd> OpenForWrite(const std::string& path);  // O_CREAT | O_TRUNC
absl::StatusOr<Fd> OpenForRead(const std::string& path);
absl::Status WriteAt(int fd, const void* data, size_t n, uint64_t offset, const std::string& path);
// Reads exactly n bytes; a short read (truncated file) is DataLoss naming the file and offset.
absl::Status ReadAt(int fd, void* data, size_t n, uint64_t offset, const std::string& path);
absl::Status Fsync(int fd, const std::string& path);
absl::Status FsyncDir(const std::string& dir);
absl::Status RenameDurably(const std::string& from, const std::string& to);  // rename + fsync of the dir
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes);
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::StatusOr<uint64_t> FileSize(const std::string& path);
absl::Status MakeDirs(const std::string& dir);

}  // namespace strata::checkpoint
