// The fuzz input as a file: the parsers under test open paths (as they do in production), so each
// harness writes its input into one memfd and hands the parser "/proc/self/fd/N". No disk I/O and no
// files left behind; reopening the path gives the parser its own descriptor and the memfd's size.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace strata::fuzz {

class MemFile {
 public:
  MemFile() : fd_(::memfd_create("strata-fuzz-input", MFD_CLOEXEC)) {
    if (fd_ < 0) Die("memfd_create");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the contents with [data, data + size).
  void Set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) Die("ftruncate");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) Die("pwrite");
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void Die(const char* call) {
    std::perror(call);  // the harness's own environment failed: not a finding in the code under test
    std::_Exit(2);
  }
  int fd_;
  std::string path_;
};

// The fuzz input as a plain file in a private directory, for readers that open files only inside a
// directory and refuse links (checkpoint shards: openat2 with RESOLVE_BENEATH refuses /proc/self/fd's
// magic links). The directory lives under $TMPDIR (or /tmp) and is removed when the process exits normally.
class DirFile {
 public:
  explicit DirFile(const char* name) : name_(name) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/strata-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) Die("mkdtemp");
    dir_ = templ;
    Registry().push_back(dir_ + "/" + name_);
    Registry().push_back(dir_);
    static const bool registered = (std::atexit(RemoveAll), true);
    (void)registered;
  }
  DirFile(const DirFile&) = delete;
  DirFile& operator=(const DirFile&) = delete;

  void Set(const uint8_t* data, size_t size) {
    const std::string path = dir_ + "/" + name_;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) Die("open");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) Die("write");
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }

 private:
  static std::vector<std::string>& Registry() {
    static auto* paths = new std::vector<std::string>();
    return *paths;
  }
  static void RemoveAll() {
    for (const std::string& p : Registry()) ::remove(p.c_str());  // the file, then its directory
  }
  [[noreturn]] static void Die(const char* call) {
    std::perror(call);
    std::_Exit(2);
  }
  std::string dir_, name_;
};

// A violated property of the code under test: prints why and aborts, which libFuzzer records as a crash
// (with the input kept).
#define STRATA_FUZZ_EXPECT(cond, ...)                                   \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "%s:%d: property failed: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                \
      std::fprintf(stderr, "\n");                                       \
      std::abort();                                                     \
    }                                                                   \
  } while (0)

}  // namespace strata::fuzz
