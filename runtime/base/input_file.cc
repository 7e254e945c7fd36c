#include "runtime/base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata {
namespace {

absl::Status OpenError(int err, absl::string_view what, const std::string& path) {
  const std::string text = absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(text);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(text);
  return absl::InvalidArgumentError(text);
}

absl::Status CheckKind(const struct stat& st, InputKind kind, absl::string_view what, const std::string& path) {
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is a directory, not a file"));
  }
  if (S_ISREG(st.st_mode) || (S_ISFIFO(st.st_mode) && kind == InputKind::kRegularFileOrFifo)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is not a regular file"));
}

// `size` is "N" (a regular file's size) or "more than N" (a FIFO cut off at the cap).
absl::Status TooLarge(absl::string_view what, const std::string& path, absl::string_view size, uint64_t max_bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", path, "' is ", size, " bytes, above the limit of ", max_bytes, " bytes"));
}

}  // namespace

uint64_t MaxTokenFileBytes() {
  const uint64_t fixed = uint64_t{64} << 30;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return fixed;
  return std::min(fixed, static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 8);
}

absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what_std, uint64_t max_bytes,
                                          InputKind kind) {
  const absl::string_view what(what_std.data(), what_std.size());
  // stat before open: opening a FIFO that is refused would block until a writer comes.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return OpenError(errno, what, path);
  STRATA_RETURN_IF_ERROR(CheckKind(st, kind, what, path));
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    return TooLarge(what, path, absl::StrCat(st.st_size), max_bytes);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(errno, what, path);
  // The path may have been replaced between stat and open: judge what was opened.
  if (::fstat(fd, &st) != 0 || !CheckKind(st, kind, what, path).ok() ||
      (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' changed while it was opened"));
  }
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(static_cast<size_t>(st.st_size));  // <= max_bytes, checked above
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(err)));
    }
    if (static_cast<uint64_t>(n) > max_bytes - text.size()) {  // a FIFO, or a file that grew while read
      ::close(fd);
      return TooLarge(what, path, absl::StrCat("more than ", max_bytes), max_bytes);
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, "config file", kMaxConfigFileBytes));
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path, "' is empty"));
  }
  return text;
}

}  // namespace strata
