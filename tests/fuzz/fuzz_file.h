// The fuzz input as a file: the parsers under test open paths (as they do in production), so each
// harness writes its input into one memfd and hands the parser "/proc/self/fd/N". No disk I/O and no
// files left behind; reopening the path gives the parser its own descriptor and the memfd's size.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

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
