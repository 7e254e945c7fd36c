// Fault tests for the NVMe store's environment (issue 5 "Faults"): each must be a clear error and
// must not damage other data.
//
// Coverage notes. Tests run as root, which bypasses directory permissions (chmod 0555 does not stop
// root), so "read-only" uses a read-only tmpfs mount (EROFS) when mounting is allowed, else a directory
// under /sys, where even root cannot create files (EACCES); a non-root run uses chmod 0555. "Disk full"
// uses a 1 MiB tmpfs when mounting is allowed (skipped with the reason otherwise); the injected-ENOSPC
// variant runs everywhere (nvme_store_conformance_test.cc, FailedWriteLeaves...). Short reads by
// injection are in the conformance suite; the end-of-file case here truncates the backing file.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/offload/nvme_files.h"
#include "runtime/offload/nvme_store.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using testing::AlignedBuffer;
using testing::FillPattern;
using testing::FirstMismatch;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::TmpfsMount;

constexpr uint64_t kMiB = 1 << 20;

class NvmeFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto q = CreateIoQueue(IoQueueOptions{.depth = 8});
    ASSERT_TRUE(q.ok()) << q.status();
    queue_ = std::move(q).value();
  }
  absl::StatusOr<std::unique_ptr<NvmeStore>> Create(const std::string& dir, uint64_t capacity,
                                                    bool preallocate = true) {
    NvmeStoreOptions o;
    o.files.paths = {dir};
    o.files.capacity_bytes = capacity;
    o.files.preallocate = preallocate;
    return NvmeStore::Create(o, queue_.get());
  }
  static bool DirIsEmpty(const std::string& dir) { return std::filesystem::is_empty(dir); }

  std::unique_ptr<IoQueue> queue_;
};

TEST_F(NvmeFaultsTest, MissingPathIsNotFoundNamingIt) {
  TempDir dir;
  const std::string missing = dir.path() + "/no/such/dir";
  auto s = Create(missing, kMiB);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(absl::StrCat("NVMe path '", missing, "' does not exist")));
}

TEST_F(NvmeFaultsTest, PathThatIsAFileIsFailedPrecondition) {
  TempDir dir;
  const std::string file = dir.path() + "/plain";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  auto s = Create(file, kMiB);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("is not a directory"));
}

TEST_F(NvmeFaultsTest, ReadOnlyPathIsPermissionDeniedNamingIt) {
  std::unique_ptr<TmpfsMount> ro;
  std::unique_ptr<TempDir> plain;
  std::string dir;
  if (geteuid() != 0) {
    plain = std::make_unique<TempDir>();
    dir = plain->path();
    ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  } else {
    ro = std::make_unique<TmpfsMount>("size=1m", /*read_only=*/true);
    dir = ro->ok() ? ro->path() : "/sys";  // root: permissions do not bind; /sys refuses new files
    if (!ro->ok()) std::fprintf(stderr, "note: %s; using /sys as the read-only path\n", ro->reason().c_str());
  }
  auto s = Create(dir, kMiB);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(absl::StrCat("NVMe path '", dir, "' is not writable")));
}

TEST_F(NvmeFaultsTest, DiskTooSmallForThePreallocationNamesPathAndBytes) {
  TmpfsMount small("size=1m");
  if (!small.ok()) GTEST_SKIP() << small.reason();
  auto s = Create(small.path(), 4 * kMiB);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  const std::string msg(s.status().message());
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("NVMe path '", small.path(), "' is too small")));
  EXPECT_THAT(msg, HasSubstr("(4194304 bytes)"));
  EXPECT_THAT(msg, HasSubstr("free"));
  EXPECT_TRUE(DirIsEmpty(small.path())) << "the partial file must be removed";
}

// NvmeStore::Grow (Note [NVMe room agreed] in runtime/engine/engine.cc): where the disk has the room, the store
// holds more and its new bytes take writes; where it has not, ResourceExhausted naming the path, the store as it was
// (its data, its capacity) and the disk's free bytes as they were: a striped set whose first file grew before the
// second found no room cuts the first back too.
TEST_F(NvmeFaultsTest, GrowingTakesTheRoomOrGivesBackWhatItTook) {
  TmpfsMount small("size=1m");
  if (!small.ok()) GTEST_SKIP() << small.reason();
  auto store = Create(small.path(), 256 * 1024);
  ASSERT_TRUE(store.ok()) << store.status();
  NvmeStore& s = **store;
  NvmeExtent old_bytes = *s.Allocate(256 * 1024, memory::Kind::kMaster);
  AlignedBuffer buf(256 * 1024);
  FillPattern(buf.data(), buf.bytes(), 1);
  ASSERT_TRUE(s.Write(old_bytes, buf.view()).Wait().ok());
  const uint64_t free_before = FreeBytes(small.path());

  const absl::Status too_big = s.Grow(4 * kMiB);
  ASSERT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted) << too_big;
  EXPECT_THAT(std::string(too_big.message()), HasSubstr(absl::StrCat("NVMe path '", small.path(), "' has no room")));
  EXPECT_THAT(std::string(too_big.message()), HasSubstr("free"));
  EXPECT_EQ(FreeBytes(small.path()), free_before) << "a failed grow keeps what it preallocated";
  EXPECT_EQ(s.capacity_bytes(), 256 * 1024u);
  EXPECT_EQ(s.Allocate(4096, memory::Kind::kMaster).status().code(), absl::StatusCode::kResourceExhausted);

  ASSERT_TRUE(s.Grow(512 * 1024).ok());
  EXPECT_EQ(s.capacity_bytes(), 512 * 1024u);
  EXPECT_EQ(FreeBytes(small.path()), free_before - 256 * 1024) << "grown by preallocation";
  NvmeExtent new_bytes = *s.Allocate(256 * 1024, memory::Kind::kMaster);
  EXPECT_EQ(s.Placement(new_bytes)[0].file_offset, 256 * 1024u);
  FillPattern(buf.data(), buf.bytes(), 2);
  ASSERT_TRUE(s.Write(new_bytes, buf.view()).Wait().ok());
  for (int i : {1, 2}) {
    ASSERT_TRUE(s.Read(i == 1 ? old_bytes : new_bytes, buf.view()).Wait().ok());
    EXPECT_EQ(FirstMismatch(buf.data(), buf.bytes(), i), -1) << "extent " << i;
  }
  old_bytes.Reset();
  new_bytes.Reset();

  TempDir roomy;
  NvmeStoreOptions o;
  o.files.paths = {roomy.path(), small.path()};
  o.files.capacity_bytes = 256 * 1024;
  o.files.stripe_bytes = 64 * 1024;
  auto striped = NvmeStore::Create(o, queue_.get());
  ASSERT_TRUE(striped.ok()) << striped.status();
  const uint64_t small_free = FreeBytes(small.path());
  ASSERT_EQ((*striped)->Grow(4 * kMiB).code(), absl::StatusCode::kResourceExhausted);
  struct stat first {};
  ASSERT_EQ(fstat((*striped)->files().fd(0), &first), 0);
  EXPECT_EQ(first.st_size, 128 * 1024) << "the first file, grown before the second failed, is cut back";
  EXPECT_LE(static_cast<uint64_t>(first.st_blocks) * 512, 128 * 1024u) << "and its blocks past the end given back";
  EXPECT_EQ(FreeBytes(small.path()), small_free);
  EXPECT_EQ((*striped)->capacity_bytes(), 256 * 1024u);
}

TEST_F(NvmeFaultsTest, DiskFullDuringAWriteFailsThatWriteOnly) {
  TmpfsMount small("size=1m");
  if (!small.ok()) GTEST_SKIP() << small.reason();
  auto store = Create(small.path(), 4 * kMiB, /*preallocate=*/false);  // sparse: writes can hit ENOSPC
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<NvmeExtent> extents;
  for (int i = 0; i < 8; ++i) extents.push_back(*(*store)->Allocate(256 * 1024, memory::Kind::kParamShard));
  AlignedBuffer buf(256 * 1024);
  int written = 0;
  absl::Status failure;
  for (int i = 0; i < 8 && failure.ok(); ++i) {
    FillPattern(buf.data(), buf.bytes(), i);
    failure = (*store)->Write(extents[i], buf.view()).Wait();
    if (failure.ok()) ++written;
  }
  ASSERT_FALSE(failure.ok()) << "8 x 256 KiB cannot fit a 1 MiB tmpfs";
  EXPECT_EQ(failure.code(), absl::StatusCode::kResourceExhausted) << failure;
  EXPECT_THAT(std::string(failure.message()), HasSubstr("errno 28"));
  EXPECT_THAT(std::string(failure.message()), HasSubstr(small.path()));
  ASSERT_GE(written, 1);
  for (int i = 0; i < written; ++i) {
    ASSERT_TRUE((*store)->Read(extents[i], buf.view()).Wait().ok()) << "extent " << i;
    EXPECT_EQ(FirstMismatch(buf.data(), buf.bytes(), i), -1) << "extent " << i;
  }
  EXPECT_EQ((*store)->Read(extents[written], buf.view()).Wait().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NvmeFaultsTest, ReadingPastTheEndOfATruncatedFileIsDataLoss) {
  TempDir dir;
  auto store = Create(dir.path(), 2 * kMiB);
  ASSERT_TRUE(store.ok()) << store.status();
  NvmeExtent a = *(*store)->Allocate(kMiB, memory::Kind::kMaster);
  NvmeExtent b = *(*store)->Allocate(kMiB, memory::Kind::kMaster);
  AlignedBuffer buf(kMiB);
  FillPattern(buf.data(), buf.bytes(), 1);
  ASSERT_TRUE((*store)->Write(a, buf.view()).Wait().ok());
  ASSERT_TRUE((*store)->Write(b, buf.view()).Wait().ok());
  const ExtentPlacement where = (*store)->Placement(b)[0];
  ASSERT_EQ(truncate(where.reopen_path.c_str(), static_cast<off_t>(where.file_offset + 4096)), 0);  // someone cut it
  const absl::Status s = (*store)->Read(b, buf.view()).Wait();
  ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("unexpected end of file"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(where.path));
  ASSERT_TRUE((*store)->Read(a, buf.view()).Wait().ok());  // the extent before the cut is intact
  EXPECT_EQ(FirstMismatch(buf.data(), buf.bytes(), 1), -1);
}

TEST_F(NvmeFaultsTest, RequiredDirectIoRefusedIsFailedPrecondition) {
  TempDir dir;
  NvmeStoreOptions o;
  o.files.paths = {dir.path()};
  o.files.capacity_bytes = kMiB;
  o.files.direct_io = DirectIo::kRequire;
  o.files.refuse_direct_for_test = true;
  auto s = NvmeStore::Create(o, queue_.get());
  ASSERT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("refuses O_DIRECT"));
  // The refused open had created the file (as Linux does): it is not left behind.
  EXPECT_TRUE(DirIsEmpty(dir.path()));
}

// A file system without O_DIRECT (ramfs; tmpfs before Linux 6.6) creates the file before refusing O_DIRECT: the
// buffered open that follows used to fail with EEXIST (O_EXCL), so such a path could not be used at all.
TEST_F(NvmeFaultsTest, AFileSystemRefusingDirectIoAtTheOpenGetsBufferedFiles) {
  TempDir dir;
  NvmeStoreOptions o;
  o.files.paths = {dir.path()};
  o.files.capacity_bytes = kMiB;
  o.files.refuse_direct_for_test = true;
  auto store = NvmeStore::Create(o, queue_.get());
  ASSERT_TRUE(store.ok()) << store.status();
  auto e = (*store)->Allocate(kMiB, memory::Kind::kScratch);
  ASSERT_TRUE(e.ok()) << e.status();
}

// The same on a real ramfs, where mounting is allowed (root): the store opens, writes and reads back.
TEST_F(NvmeFaultsTest, RamfsWhichRefusesDirectIoGetsBufferedFiles) {
  TmpfsMount ramfs("", false, "ramfs");
  if (!ramfs.ok()) GTEST_SKIP() << ramfs.reason();
  auto store = Create(ramfs.path(), kMiB);
  ASSERT_TRUE(store.ok()) << store.status();
  auto e = (*store)->Allocate(kMiB, memory::Kind::kScratch);
  ASSERT_TRUE(e.ok()) << e.status();
  AlignedBuffer out(kMiB), in(kMiB);
  FillPattern(out.data(), kMiB, 5);
  ASSERT_TRUE((*store)->Write(*e, out.view()).Wait().ok());
  ASSERT_TRUE((*store)->Read(*e, in.view()).Wait().ok());
  EXPECT_EQ(FirstMismatch(in.data(), kMiB, 5), -1);
}

TEST_F(NvmeFaultsTest, FragmentedStoreNamesTheLargestFreeRange) {
  TempDir dir;
  auto store = Create(dir.path(), 4 * kMiB);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<NvmeExtent> e;
  for (int i = 0; i < 4; ++i) e.push_back(*(*store)->Allocate(kMiB, memory::Kind::kScratch));
  e[0].Reset();
  e[2].Reset();  // 2 MiB free, in two 1 MiB holes
  auto s = (*store)->Allocate(2 * kMiB, memory::Kind::kScratch);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("largest free range 1.00 MiB"));
}

}  // namespace
}  // namespace strata::offload
