// Names from a checkpoint stay inside their directory (Note [Confined names]): plain names only, and no
// symlink escapes, through openat2 and through its fallback; temporaries never outlive a failure.
#include "runtime/checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/checkpoint/test_dir.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Files = testing::TestDir;

TEST(CheckPlainFileName, AcceptsOnlyOnePlainComponent) {
  EXPECT_TRUE(CheckPlainFileName("shard_00000.bin").ok());
  EXPECT_TRUE(CheckPlainFileName("..x").ok());
  for (const char* bad : {"", ".", "..", "../x", "/etc/passwd", "a/b", "x/", "a/../b"}) {
    EXPECT_EQ(CheckPlainFileName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(CheckPlainFileName(std::string("a\0b", 3)).ok());
  for (const char* bad : {"a\x01", "\tx", "x\x1b[0m", "del\x7f", "x\n"}) {
    const absl::Status s = CheckPlainFileName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("holds a control byte")) << bad;
  }
  EXPECT_TRUE(CheckPlainFileName("caf\xc3\xa9.bin").ok());  // UTF-8 is not a control byte
  EXPECT_FALSE(CheckPlainFileName(std::string(256, 'a')).ok());
}

TEST_F(Files, OpenInDirReadsAFileInside) {
  Write("step/a.bin", "abc");
  for (auto open : {&OpenInDir, &OpenInDirNoFollow}) {
    auto fd = open(Path("step"), "a.bin");
    ASSERT_TRUE(fd.ok()) << fd.status();
    auto size = FileSize(fd->get(), "a.bin");
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, 3u);
  }
}

// A FIFO in a step directory hung the reader in open() waiting for a writer.
TEST_F(Files, AFifoInTheStepDirectoryIsRefusedWithoutBlocking) {
  Write("step/a.bin", "abc");
  ASSERT_EQ(::mkfifo(Path("step/fifo.bin").c_str(), 0600), 0);
  for (auto open : {&OpenInDir, &OpenInDirNoFollow}) {
    auto fd = open(Path("step"), "fifo.bin");
    ASSERT_TRUE(fd.ok()) << fd.status();
    EXPECT_THAT(std::string(FileSize(fd->get(), "fifo.bin").status().message()), HasSubstr("is not a regular file"));
  }
  auto text = ReadFileInDir(Path("step"), "fifo.bin", 1 << 20);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("is not a regular file"));
}

TEST_F(Files, OpenInDirRefusesPathsOutside) {
  Write("step/a.bin", "abc");
  Write("outside.bin", "secret");
  for (auto open : {&OpenInDir, &OpenInDirNoFollow}) {
    for (const std::string& name :
         {std::string("../outside.bin"), Path("outside.bin"), std::string("sub/../../outside.bin")}) {
      auto fd = open(Path("step"), name);
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << name;
      EXPECT_THAT(std::string(fd.status().message()), HasSubstr(name));
    }
  }
}

TEST_F(Files, OpenInDirRefusesASymlinkPointingOutside) {
  Write("step/a.bin", "abc");
  Write("outside.bin", "secret");
  fs::create_symlink(Path("outside.bin"), Path("step/abs_link.bin"));
  fs::create_symlink("../outside.bin", Path("step/rel_link.bin"));
  for (auto open : {&OpenInDir, &OpenInDirNoFollow}) {
    for (const char* link : {"abs_link.bin", "rel_link.bin"}) {
      auto fd = open(Path("step"), link);
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << link;
      EXPECT_THAT(std::string(fd.status().message()), HasSubstr("symlink or resolves outside")) << link;
    }
  }
}

TEST_F(Files, MissingFileIsNotAnEscape) {
  fs::create_directories(Path("step"));
  auto fd = OpenInDir(Path("step"), "nope.bin");
  EXPECT_NE(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fd.ok());
}

TEST_F(Files, ReadFileInDirBoundsTheSize) {
  Write("step/m.json", "0123456789");
  auto all = ReadFileInDir(Path("step"), "m.json", 10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, "0123456789");
  EXPECT_EQ(ReadFileInDir(Path("step"), "m.json", 9).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(Files, TempFileIsRemovedUnlessCommitted) {
  Write("a.tmp.1", "x");
  Write("b.tmp.1", "x");
  {
    TempFile a(Path("a.tmp.1"));
    TempFile b(Path("b.tmp.1"));
    TempFile moved = std::move(b);
    moved.Commit();
  }
  EXPECT_FALSE(fs::exists(Path("a.tmp.1")));
  EXPECT_TRUE(fs::exists(Path("b.tmp.1")));
}

TEST_F(Files, FailedAtomicWriteLeavesNoTemporary) {
  // The target is a non-empty directory: the rename fails after the temporary was written.
  Write("target/inside", "x");
  absl::Status s = WriteFileAtomic(Path("target"), "payload");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Temps(dir_), IsEmpty());
  ASSERT_TRUE(WriteFileAtomic(Path("ok.json"), "payload").ok());
  EXPECT_THAT(Temps(dir_), IsEmpty());
}

// Writing over a FIFO or a device node once replaced it with a regular file (as root, /dev/full).
TEST_F(Files, AtomicWritesRefuseToReplaceAFifoOrADevice) {
  ASSERT_EQ(::mkfifo(Path("pipe").c_str(), 0600), 0);
  absl::Status s = WriteFileAtomic(Path("pipe"), "payload");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("exists and is a FIFO: refusing to replace it"));
  struct stat st;
  ASSERT_EQ(::lstat(Path("pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO is still there";
  EXPECT_THAT(Temps(dir_), IsEmpty());
  EXPECT_FALSE(CheckReplaceable("/dev/null").ok()) << "a character device";
  EXPECT_TRUE(CheckReplaceable(Path("absent")).ok());
  Write("file", "x");
  EXPECT_TRUE(CheckReplaceable(Path("file")).ok());
}

TEST_F(Files, RemoveTempsRemovesOnlyPickedTemporaries) {
  for (const char* n : {"shard_00000.bin.tmp.1", "shard_00001.bin.tmp.2", "shard_00000.bin", "manifest.json"}) {
    Write(n, "x");
  }
  auto removed = RemoveTemps(dir_.string(), [](absl::string_view n) { return n.substr(0, 11) == "shard_00000"; });
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, ::testing::ElementsAre("shard_00000.bin.tmp.1"));
  EXPECT_THAT(Temps(dir_), ::testing::ElementsAre("shard_00001.bin.tmp.2"));
  EXPECT_TRUE(fs::exists(Path("shard_00000.bin")));
}

// Note [Direct checkpoint writes]: whether the file system behind `dir` opens a file with O_DIRECT.
bool TakesDirectIo(const std::string& dir) {
  const std::string probe = dir + "/direct_probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

bool OpenWithDirect(const StreamFile& f) { return (::fcntl(f.fd(), F_GETFL) & O_DIRECT) != 0; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Note [Direct checkpoint writes]: a body written in pieces of every size around the buffer's and the block's
// (1 byte to 2.5 buffers), then a header at 0, gives the same file whether it went through O_DIRECT, was buffered
// from the start, or turned buffered half-way (a piece written out of order); O_DIRECT is on for as long as the
// stream is written in order, where the file system takes it.
TEST_F(Files, AStreamWrittenWithODirectIsTheFileABufferedOneWrites) {
  constexpr size_t kBuffer = 3 * StreamFile::kDirectAlign;
  constexpr uint64_t kStart = StreamFile::kDirectAlign;
  const size_t sizes[] = {1, 4095, 4096, 4097, kBuffer - 1, kBuffer, kBuffer + 1, 5 * kBuffer / 2, 3, 8192};
  std::string body;
  for (size_t n : sizes) {
    for (size_t i = 0; i < n; ++i) body.push_back(static_cast<char>((body.size() * 131 + 7) % 251));
  }
  const std::string header(kStart, 'h');
  const bool direct_fs = TakesDirectIo(dir_.string());
  // out_of_order: the piece before last is written after the last one.
  auto write = [&](const std::string& name, bool direct, bool out_of_order) -> std::string {
    auto f = StreamFile::Create(Path(name), kStart, direct, kBuffer);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return "";
    EXPECT_EQ(f->direct(), direct && direct_fs) << name;
    EXPECT_EQ(OpenWithDirect(*f), direct && direct_fs) << name;
    uint64_t at = kStart;
    const size_t last = std::size(sizes) - 1;
    for (size_t k = 0; k < std::size(sizes); ++k) {
      if (out_of_order && k == last - 1) {
        const uint64_t skip = at + sizes[k];
        EXPECT_TRUE(f->Write(body.data() + (skip - kStart), sizes[last], skip).ok());
        EXPECT_FALSE(f->direct()) << "a write out of order left O_DIRECT on";
        EXPECT_FALSE(OpenWithDirect(*f));
      }
      if (out_of_order && k == last) break;
      EXPECT_TRUE(f->Write(body.data() + (at - kStart), sizes[k], at).ok());
      at += sizes[k];
      if (!out_of_order) {
        EXPECT_EQ(OpenWithDirect(*f), direct && direct_fs) << "after piece " << k;
      }
    }
    EXPECT_TRUE(f->Flush().ok());
    EXPECT_FALSE(OpenWithDirect(*f)) << "a header written after Flush needs no alignment";
    EXPECT_TRUE(f->Write(header.data(), header.size(), 0).ok());
    EXPECT_TRUE(Fsync(f->fd(), Path(name)).ok());
    return ReadAll(Path(name));
  };
  const std::string want = header + body;
  EXPECT_TRUE(write("direct.bin", true, false) == want) << "direct";
  EXPECT_TRUE(write("buffered.bin", false, false) == want) << "buffered";
  EXPECT_TRUE(write("turned.bin", true, true) == want) << "turned buffered half-way";
}

// A stream that ends on a block's edge is not padded, and one with no bytes at all is only its header.
TEST_F(Files, AStreamEndsWhereItsLastByteDoes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{StreamFile::kDirectAlign}}) {
    const std::string name = absl::StrCat("s", n);
    auto f = StreamFile::Create(Path(name), StreamFile::kDirectAlign);
    ASSERT_TRUE(f.ok()) << f.status();
    const std::string bytes(n, 'x');
    ASSERT_TRUE(f->Write(bytes.data(), n, StreamFile::kDirectAlign).ok());
    ASSERT_TRUE(f->Flush().ok());
    ASSERT_TRUE(f->Write("h", 1, 0).ok());
    *f = StreamFile();
    EXPECT_EQ(fs::file_size(Path(name)), n == 0 ? 1 : StreamFile::kDirectAlign + n) << n;
  }
}

// A moved-from StreamFile holds no file and nothing pending (a review found the default move left it claiming
// O_DIRECT with no buffer); the one moved to finishes the file.
TEST_F(Files, AMovedStreamFileLeavesNothingBehind) {
  auto f = StreamFile::Create(Path("moved"), StreamFile::kDirectAlign);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->Write("abc", 3, StreamFile::kDirectAlign).ok());
  StreamFile to = std::move(*f);
  EXPECT_FALSE(f->direct());
  EXPECT_LT(f->fd(), 0);
  EXPECT_TRUE(f->Flush().ok()) << "nothing pending in the moved-from file";
  ASSERT_TRUE(to.Flush().ok());
  ASSERT_TRUE(to.Close().ok());
  EXPECT_EQ(fs::file_size(Path("moved")), StreamFile::kDirectAlign + 3);
}

}  // namespace
}  // namespace strata::checkpoint
