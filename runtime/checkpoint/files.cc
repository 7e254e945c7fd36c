#include "runtime/checkpoint/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/escaping.h"
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

TempFile::~TempFile() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

TempFile& TempFile::operator=(TempFile&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

std::string TempName(const std::string& path) { return absl::StrCat(path, ".tmp.", ::getpid()); }

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

absl::Status CheckPlainFileName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("the file name is empty");
  if (name.size() > 255) return absl::InvalidArgumentError("the file name is longer than 255 bytes");
  // A NUL cut the name (and the error naming it) short; other control bytes reached the terminal raw.
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("the file name holds a control byte (0x", absl::Hex(c, absl::kZeroPad2), " at byte ", i, ")"));
    }
  }
  if (name.front() == '/') return absl::InvalidArgumentError("an absolute path is not allowed");
  if (name.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError("a path with '/' is not allowed (one plain name inside the step directory)");
  }
  if (name == "." || name == "..") return absl::InvalidArgumentError("'.' and '..' are not file names");
  return absl::OkStatus();
}

namespace {

absl::Status Escapes(const std::string& dir, const std::string& name) {
  return absl::PermissionDeniedError(
      absl::StrCat("'", name, "' in '", dir, "' is a symlink or resolves outside that directory; refused"));
}

absl::StatusOr<Fd> OpenDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Err("open", dir);
  return Fd(fd);
}

}  // namespace

absl::StatusOr<Fd> OpenInDirNoFollow(const std::string& dir, const std::string& name) {
  if (absl::Status s = CheckPlainFileName(name); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("'", absl::CHexEscape(name), "' in '", dir, "': ", s.message()));
  }
  STRATA_ASSIGN_OR_RETURN(Fd d, OpenDir(dir));
  const int fd = ::openat(d.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) return Escapes(dir, name);
    return Err("openat", absl::StrCat(dir, "/", name));
  }
  return Fd(fd);
}

absl::StatusOr<Fd> OpenInDir(const std::string& dir, const std::string& name) {
  if (absl::Status s = CheckPlainFileName(name); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("'", absl::CHexEscape(name), "' in '", dir, "': ", s.message()));
  }
  STRATA_ASSIGN_OR_RETURN(Fd d, OpenDir(dir));
  struct open_how how {};
  // O_NONBLOCK: a FIFO planted in a checkpoint opens at once (then FileSize refuses it) instead of
  // blocking for a writer; a regular file's reads ignore the flag.
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd;
  do {
    fd = ::syscall(SYS_openat2, d.get(), name.c_str(), &how, sizeof how);
  } while (fd < 0 && (errno == EINTR || errno == EAGAIN));
  if (fd >= 0) return Fd(static_cast<int>(fd));
  if (errno == ENOSYS || errno == EPERM) return OpenInDirNoFollow(dir, name);
  if (errno == EXDEV || errno == ELOOP) return Escapes(dir, name);
  return Err("openat2", absl::StrCat(dir, "/", name));
}

absl::StatusOr<std::string> ReadFileInDir(const std::string& dir, const std::string& name, uint64_t max_bytes) {
  STRATA_ASSIGN_OR_RETURN(Fd fd, OpenInDir(dir, name));
  const std::string path = (std::filesystem::path(dir) / name).string();
  STRATA_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), path));
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("'", path, "' has ", size, " bytes, more than the ", max_bytes,
                                                     " allowed for it"));
  }
  std::string out(size, '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), out.data(), size, 0, path));
  return out;
}

absl::StatusOr<std::vector<std::string>> RemoveTemps(const std::string& dir,
                                                     const std::function<bool(absl::string_view)>& pick) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Err("opendir", dir);
  absl::Status status;
  while (const dirent* e = ::readdir(d)) {
    const absl::string_view name(e->d_name);
    if (name.find(".tmp.") == absl::string_view::npos || !pick(name)) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) != 0) {
      status = Err("unlinkat", absl::StrCat(dir, "/", std::string(name)));
      break;
    }
    removed.emplace_back(name);
  }
  ::closedir(d);
  if (!status.ok()) return status;
  return removed;
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

void StreamFile::Unmap::operator()(char* p) const { ::munmap(p, bytes); }

StreamFile& StreamFile::operator=(StreamFile&& o) noexcept {
  if (this != &o) {
    path_ = std::move(o.path_);
    fd_ = std::move(o.fd_);
    direct_ = std::exchange(o.direct_, false);
    buffer_ = std::move(o.buffer_);
    buffer_bytes_ = std::exchange(o.buffer_bytes_, 0);
    pending_ = std::exchange(o.pending_, 0);
    pending_at_ = std::exchange(o.pending_at_, 0);
  }
  return *this;
}

absl::StatusOr<StreamFile> StreamFile::Create(const std::string& path, uint64_t start, bool direct,
                                              size_t buffer_bytes) {
  StreamFile f;
  f.path_ = path;
  f.pending_at_ = start;
  f.buffer_bytes_ = std::max<size_t>(kDirectAlign, buffer_bytes / kDirectAlign * kDirectAlign);
  if (direct && start % kDirectAlign == 0) {
    void* p = ::mmap(nullptr, f.buffer_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) f.buffer_ = std::unique_ptr<char, Unmap>(static_cast<char*>(p), Unmap{f.buffer_bytes_});
  }
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = -1;
  if (f.buffer_ != nullptr) {
    fd = ::open(path.c_str(), kFlags | O_DIRECT, 0644);
    f.direct_ = fd >= 0;
    if (fd < 0 && errno != EINVAL) return Err("open", path);
  }
  if (fd < 0) {  // buffered: asked for, no buffer, or the file system refuses O_DIRECT (EINVAL)
    f.buffer_.reset();
    fd = ::open(path.c_str(), kFlags, 0644);
    if (fd < 0) return Err("open", path);
  }
  f.fd_ = Fd(fd);
  return f;
}

absl::Status StreamFile::Write(const void* data, size_t n, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  if (direct_ && offset == pending_at_ + pending_) {
    while (n > 0) {
      const size_t take = std::min(n, buffer_bytes_ - pending_);
      std::memcpy(buffer_.get() + pending_, p, take);
      pending_ += take;
      p += take;
      offset += take;
      n -= take;
      if (pending_ == buffer_bytes_) STRATA_RETURN_IF_ERROR(WriteBlocks(pending_));
      if (!direct_) break;  // WriteBlocks turned the file buffered: the rest below
    }
    if (n == 0) return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(TurnBuffered());
  return WriteAt(fd_.get(), p, n, offset, path_);
}

absl::Status StreamFile::WriteBlocks(size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd_.get(), buffer_.get() + done, n - done, static_cast<off_t>(pending_at_ + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) break;  // refused at the write: the rest buffered
      return Err("pwrite", path_);
    }
    done += static_cast<size_t>(w);
    if (done % kDirectAlign != 0) break;  // a short write that ends inside a block: the rest buffered
  }
  std::memmove(buffer_.get(), buffer_.get() + done, pending_ - done);
  pending_ -= done;
  pending_at_ += done;
  return done < n ? TurnBuffered() : absl::OkStatus();
}

absl::Status StreamFile::TurnBuffered() {
  if (!direct_) return absl::OkStatus();
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT) != 0) return Err("fcntl", path_);
  direct_ = false;
  STRATA_RETURN_IF_ERROR(WriteAt(fd_.get(), buffer_.get(), pending_, pending_at_, path_));
  pending_at_ += pending_;
  pending_ = 0;
  buffer_.reset();
  return absl::OkStatus();
}

absl::Status StreamFile::Flush() {
  if (direct_ && pending_ > 0) {  // the last block padded with zeros, then the file cut back to the stream's end
    const uint64_t end = pending_at_ + pending_;
    const size_t padded = (pending_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(buffer_.get() + pending_, 0, padded - pending_);
    pending_ = padded;
    STRATA_RETURN_IF_ERROR(WriteBlocks(padded));
    if (::ftruncate(fd_.get(), static_cast<off_t>(end)) != 0) return Err("ftruncate", path_);
  }
  return TurnBuffered();
}

absl::Status StreamFile::Resume(uint64_t at) {
  if (direct_ && (pending_ % kDirectAlign != 0 || at % kDirectAlign != 0)) return TurnBuffered();
  if (direct_ && pending_ > 0) {
    STRATA_RETURN_IF_ERROR(WriteBlocks(pending_));
    if (!direct_) return absl::OkStatus();  // WriteBlocks turned the file buffered
  }
  pending_at_ = at;
  return absl::OkStatus();
}

absl::Status StreamFile::Close() {
  buffer_.reset();
  direct_ = false;
  pending_ = 0;
  if (fd_.get() >= 0 && ::close(fd_.release()) != 0) return Err("close", path_);
  return absl::OkStatus();
}

absl::Status CloneRange(int src, const std::string& src_path, uint64_t src_offset, int dst, const std::string& dst_path,
                        uint64_t dst_offset, uint64_t n) {
  file_clone_range arg{};
  arg.src_fd = src;
  arg.src_offset = src_offset;
  arg.src_length = n;
  arg.dest_offset = dst_offset;
  int rc;
  do {
    rc = ::ioctl(dst, FICLONERANGE, &arg);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return absl::OkStatus();
  const int e = errno;
  if (e == EOPNOTSUPP || e == EXDEV || e == EINVAL || e == ENOTTY) {
    return absl::UnimplementedError(
        absl::StrCat("cannot clone ", src_path, " into ", dst_path, ": ", std::strerror(e)));
  }
  return Annotate(ErrnoError("ioctl(FICLONERANGE)", e, __FILE__, __LINE__), absl::StrCat(src_path, " -> ", dst_path));
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

absl::Status CheckReplaceable(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? absl::OkStatus() : Err("lstat", path);
  // A directory is left to rename(), which refuses to put a file in its place (EISDIR): nothing is lost.
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) return absl::OkStatus();
  const char* kind = S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return absl::FailedPreconditionError(
      absl::StrCat("'", path, "' exists and is ", kind, ": refusing to replace it with a file; choose another path"));
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  STRATA_RETURN_IF_ERROR(CheckReplaceable(path));
  TempFile tmp(TempName(path));
  {
    STRATA_ASSIGN_OR_RETURN(Fd fd, OpenForWrite(tmp.path()));
    STRATA_RETURN_IF_ERROR(WriteAt(fd.get(), bytes.data(), bytes.size(), 0, tmp.path()));
    STRATA_RETURN_IF_ERROR(Fsync(fd.get(), tmp.path()));
  }
  if (::rename(tmp.path().c_str(), path.c_str()) != 0) return Err("rename", absl::StrCat(tmp.path(), " -> ", path));
  tmp.Commit();
  return FsyncDir(Parent(path));
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

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Err("fstat", path);
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  return static_cast<uint64_t>(st.st_size);
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  return absl::OkStatus();
}

}  // namespace strata::checkpoint
