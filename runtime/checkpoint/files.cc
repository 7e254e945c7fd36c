#include "runtime/checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::checkpoint {
namespace {

absl::Status Err(const char* call, const std::string& path) {
  return Annotate(ErrnoError(call, errno, __FILE__, __LINE__), path);
}

std::string Parent(const std::string& path) {
  const std::string p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

absl::StatusOr<Fd> OpenForWrite(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Err("open", path);
  return Fd(fd);
}

absl::StatusOr<Fd> OpenForRead(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Err("open", path);
  return Fd(fd);
}

absl::Status WriteAt(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Err("pwrite", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAt(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Err("pread", path);
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat("file '", path, "' ends at byte ", offset, " with ", n,
                                              " more bytes expected (truncated?)"));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status Fsync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return Err("fsync", path);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Err("open", dir);
  Fd owner(fd);
  return Fsync(fd, dir);
}

absl::Status RenameDurably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return Err("rename", absl::StrCat(from, " -> ", to));
  return FsyncDir(Parent(to));
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    STRATA_ASSIGN_OR_RETURN(Fd fd, OpenForWrite(tmp));
    STRATA_RETURN_IF_ERROR(WriteAt(fd.get(), bytes.data(), bytes.size(), 0, tmp));
    STRATA_RETURN_IF_ERROR(Fsync(fd.get(), tmp));
  }
  return RenameDurably(tmp, path);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(Fd fd, OpenForRead(path));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
  std::string out(size, '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), out.data(), size, 0, path));
  return out;
}

absl::StatusOr<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Err("stat", path);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  return absl::OkStatus();
}

}  // namespace strata::checkpoint
