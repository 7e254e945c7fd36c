// Helpers shared by the offload tests: scratch directories, aligned buffers with a recognisable
// pattern, the I/O back-ends to instantiate suites for, size-limited tmpfs mounts for disk-full tests, and a small
// XFS for the clone paths.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/memory/memory.h"
#include "runtime/offload/io_queue.h"
#include "runtime/offload/nvme_store.h"

namespace strata::offload::testing {

// A fresh directory under /tmp (ext4 here: O_DIRECT works), removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "strata-offload-XXXXXX").string();
    path_ = mkdtemp(t.data()) ? t : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A 4096-aligned heap buffer.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    data_ = static_cast<char*>(std::aligned_alloc(4096, std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096)));
    std::memset(data_, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  memory::BufferView view() const { return memory::BufferView{data_, bytes_, memory::Tier::kPinnedHost}; }

 private:
  char* data_;
  size_t bytes_;
};

// Byte i of pattern `seed`: distinct across seeds and positions, never constant over a block.
inline char PatternByte(uint64_t seed, uint64_t i) { return static_cast<char>((i * 2654435761u + seed * 40503u) >> 7); }
inline void FillPattern(char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = PatternByte(seed, i);
}
// Index of the first byte that differs from the pattern, or -1.
inline int64_t FirstMismatch(const char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(seed, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// The back-ends a suite runs on; io_uring only when built (tests skip it when the kernel refuses).
inline std::vector<IoBackend> Backends() {
  std::vector<IoBackend> b;
  if (UringCompiledIn()) b.push_back(IoBackend::kUring);
  b.push_back(IoBackend::kThreads);
  return b;
}
inline std::string BackendParamName(const ::testing::TestParamInfo<IoBackend>& info) {
  return std::string(IoBackendName(info.param));
}

// Creates a queue of `backend`; skips the test when io_uring is refused by this kernel / sandbox.
#define STRATA_MAKE_QUEUE_OR_SKIP(var, options)                                      \
  auto var##_or = ::strata::offload::CreateIoQueue(options);                         \
  if (!var##_or.ok() && (options).backend == ::strata::offload::IoBackend::kUring) { \
    GTEST_SKIP() << "io_uring unavailable here: " << var##_or.status();              \
  }                                                                                  \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                                   \
  std::unique_ptr<::strata::offload::IoQueue> var = std::move(var##_or).value()

// An I/O queue of `backend` (depth 16) and a store of `capacity_bytes` in one file under `dir`. Skips the
// test when io_uring is refused; callers return when IsSkipped() or HasFatalFailure().
inline void MakeQueueAndStore(IoBackend backend, const std::string& dir, uint64_t capacity_bytes,
                              std::unique_ptr<IoQueue>* queue, std::unique_ptr<NvmeStore>* store) {
  const IoQueueOptions options{.backend = backend, .depth = 16};
  STRATA_MAKE_QUEUE_OR_SKIP(q, options);
  *queue = std::move(q);
  NvmeStoreOptions so;
  so.files.paths = {dir};
  so.files.capacity_bytes = capacity_bytes;
  auto s = NvmeStore::Create(so, queue->get());
  ASSERT_TRUE(s.ok()) << s.status();
  *store = std::move(s).value();
}

// A tmpfs with `options` ("size=1m") mounted on a fresh directory (needs CAP_SYS_ADMIN); unmounted at the end.
// ok() is false, and reason() says why, when the mount is refused.
class TmpfsMount {
 public:
  explicit TmpfsMount(const std::string& options, bool read_only = false, const char* type = "tmpfs") {
    if (mount("strata-test", dir_.path().c_str(), type, read_only ? MS_RDONLY : 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      reason_ =
          absl::StrCat("mount -t ", type, " -o ", read_only ? "ro," : "", options, " refused: ", std::strerror(errno));
    }
  }
  ~TmpfsMount() {
    if (mounted_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string reason_;
};

// A small XFS with reflink (blocks shared between files: Note [Cloned checkpoint lanes] in
// runtime/checkpoint/files.h) on a loop device over a sparse file, for the clone paths. Needs root, loop devices and
// xfsprogs' mkfs.xfs (scripts/install_deps installs it); where one is missing ok() is false and reason() says
// which, and RequireXfs() tells the test whether to fail (STRATA_REQUIRE_XFS=1, as .ci/run sets) or skip.
class XfsMount {
 public:
  XfsMount() {
    const std::string image = image_dir_.path() + "/xfs.img";
    FILE* f = std::fopen(image.c_str(), "w");
    const bool sized = f != nullptr && ::ftruncate(::fileno(f), off_t{512} << 20) == 0;  // mkfs.xfs's least is 300 MB
    if (f != nullptr) std::fclose(f);
    if (!sized) {
      reason_ = absl::StrCat("cannot make a 512 MiB image at ", image, ": ", std::strerror(errno));
    } else if (std::system(absl::StrCat("mkfs.xfs -q -f -m reflink=1 ", image, " >/dev/null 2>&1").c_str()) != 0) {
      reason_ = "mkfs.xfs -m reflink=1 failed (is xfsprogs installed? scripts/install_deps installs it)";
    } else if (std::system(absl::StrCat("mount -o loop ", image, " ", dir_.path(), " >/dev/null 2>&1").c_str()) != 0) {
      reason_ = "mount -o loop of an XFS image failed (needs root and a loop device)";
    } else {
      mounted_ = true;
    }
  }
  ~XfsMount() {
    if (!mounted_) return;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path(), ec))
      std::filesystem::remove_all(e.path(), ec);
    if (umount2(dir_.path().c_str(), 0) != 0) umount2(dir_.path().c_str(), MNT_DETACH);  // the loop device goes with it
  }
  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return dir_.path(); }
  static bool RequireXfs() {
    const char* v = std::getenv("STRATA_REQUIRE_XFS");
    return v != nullptr && std::string(v) == "1";
  }

 private:
  TempDir image_dir_, dir_;
  bool mounted_ = false;
  std::string reason_;
};

// The bytes of `path` in extents the file system reports shared with another file (FIEMAP_EXTENT_SHARED).
inline uint64_t SharedBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  constexpr uint32_t kExtents = 512;
  std::vector<char> buf(sizeof(fiemap) + kExtents * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  uint64_t shared = 0, start = 0;
  for (bool last = false; !last;) {
    std::memset(buf.data(), 0, buf.size());
    fm->fm_start = start;
    fm->fm_length = FIEMAP_MAX_OFFSET - start;
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = kExtents;
    if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0 || fm->fm_mapped_extents == 0) break;
    for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      if (e.fe_flags & FIEMAP_EXTENT_SHARED) shared += e.fe_length;
      last = last || (e.fe_flags & FIEMAP_EXTENT_LAST) != 0;
      start = e.fe_logical + e.fe_length;
    }
  }
  ::close(fd);
  return shared;
}

}  // namespace strata::offload::testing
