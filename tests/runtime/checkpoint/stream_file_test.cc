// Note [Direct checkpoint writes]: StreamFile against a reference model of the file (random writes, in order
// and not), and with the kernel's answers a file system may give at a write (EINVAL, short writes, ENOSPC, a
// failing ftruncate) injected by replacing pwrite and ftruncate in this binary.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/shard_file.h"
#include "tests/runtime/checkpoint/test_dir.h"

namespace {

// What the next pwrite calls answer. `nth` counts the pwrites the fault applies to (from 1).
struct Fault {
  enum Kind { kNone, kEinvalDirect, kShortDirect, kEnospc, kFailTruncate } kind = kNone;
  int nth = 0;
  size_t short_bytes = 0;
  int seen = 0;
  int fired = 0;
};
Fault g_fault;

bool IsDirect(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) != 0;
}

using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);
using FtruncateFn = int (*)(int, off_t);

ssize_t Pwrite(const char* name, int fd, const void* buf, size_t n, off_t off) {
  static PwriteFn real = reinterpret_cast<PwriteFn>(::dlsym(RTLD_NEXT, name));
  const Fault::Kind k = g_fault.kind;
  const bool applies = (k == Fault::kEinvalDirect || k == Fault::kShortDirect) ? IsDirect(fd) : k == Fault::kEnospc;
  if (applies && ++g_fault.seen == g_fault.nth) {
    ++g_fault.fired;
    if (k == Fault::kEinvalDirect) return errno = EINVAL, -1;
    if (k == Fault::kEnospc) return errno = ENOSPC, -1;
    return real(fd, buf, std::min(n, g_fault.short_bytes), off);
  }
  return real(fd, buf, n, off);
}

}  // namespace

extern "C" ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) { return Pwrite("pwrite", fd, buf, n, off); }
extern "C" ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  return Pwrite("pwrite64", fd, buf, n, off);
}
extern "C" int ftruncate(int fd, off_t len) {
  static FtruncateFn real = reinterpret_cast<FtruncateFn>(::dlsym(RTLD_NEXT, "ftruncate"));
  if (g_fault.kind == Fault::kFailTruncate) return ++g_fault.fired, errno = EIO, -1;
  return real(fd, len);
}

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class StreamFileTest : public testing::TestDir {
 protected:
  void TearDown() override {
    g_fault = Fault();
    testing::TestDir::TearDown();
  }
  // Whether the file system under the test's directory takes O_DIRECT (StreamFile's own answer).
  bool DirectHere() {
    auto f = StreamFile::Create(Path("probe"), 0);
    return f.ok() && f->direct();
  }
  // After a write whose nth pwrite was to fail with ENOSPC (`s` its outcome; the writer gone): false when no
  // write was left to fail (then `s` is OK). Else `s` names the error, and neither `path` nor a temporary is left.
  bool FailedCleanly(const absl::Status& s, const std::string& path, int nth) {
    const int fired = g_fault.fired;
    g_fault = Fault();
    if (fired == 0) {
      EXPECT_TRUE(s.ok()) << s;
      return false;
    }
    EXPECT_FALSE(s.ok()) << nth;
    EXPECT_THAT(s.message(), HasSubstr("No space")) << s;
    EXPECT_FALSE(fs::exists(path)) << nth;
    EXPECT_THAT(Temps(dir_), IsEmpty()) << nth;
    return true;
  }
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The file a sequence of writes gives, holes as zeros.
void Apply(std::string* model, const std::string& bytes, uint64_t offset) {
  if (bytes.empty()) return;  // writing no bytes does not extend a file
  if (model->size() < offset + bytes.size()) model->resize(offset + bytes.size(), '\0');
  model->replace(offset, bytes.size(), bytes);
}

// One random file: mostly in-order pieces of sizes around the block's and the buffer's, now and then a write
// elsewhere, then Flush and a header at 0. Returns the file's bytes and the model's.
struct Outcome {
  std::string file, model;
  bool ok = true;
};

Outcome RandomFile(const std::string& path, uint32_t seed, bool direct) {
  std::mt19937 rng(seed);
  auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  const size_t buffer = StreamFile::kDirectAlign * (1 + pick(3));
  const uint64_t starts[] = {0, StreamFile::kDirectAlign, 2 * StreamFile::kDirectAlign, 100};
  const uint64_t start = starts[pick(4)];
  Outcome o;
  auto f = StreamFile::Create(path, start, direct, buffer);
  if (!f.ok()) return o.ok = false, o;
  uint64_t at = start;
  const int pieces = 1 + static_cast<int>(pick(30));
  for (int k = 0; k < pieces; ++k) {
    const size_t sizes[] = {0, 1, 3, 4095, 4096, 4097, buffer - 1, buffer, buffer + 1, pick(3 * buffer)};
    const size_t n = sizes[pick(std::size(sizes))];
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    uint64_t offset = at;
    const bool elsewhere = pick(12) == 0;
    if (elsewhere) offset = pick(at + 3 * StreamFile::kDirectAlign);
    if (!f->Write(bytes.data(), n, offset).ok()) return o.ok = false, o;
    Apply(&o.model, bytes, offset);
    if (!elsewhere) at += n;
  }
  if (!f->Flush().ok()) return o.ok = false, o;
  if (f->direct()) return o.ok = false, o;
  if (pick(2) == 0 && start > 0) {
    const std::string header(start, 'h');
    if (!f->Write(header.data(), header.size(), 0).ok()) return o.ok = false, o;
    Apply(&o.model, header, 0);
  }
  *f = StreamFile();
  o.file = ReadAll(path);
  return o;
}

TEST_F(StreamFileTest, RandomWritesGiveTheReferenceFileDirectAndBuffered) {
  for (uint32_t seed = 0; seed < 400; ++seed) {
    for (bool direct : {true, false}) {
      const Outcome o = RandomFile(Path(absl::StrCat("f", seed, direct)), seed, direct);
      ASSERT_TRUE(o.ok) << seed << " " << direct;
      ASSERT_EQ(o.file.size(), o.model.size()) << seed << " " << direct;
      ASSERT_TRUE(o.file == o.model) << seed << " " << direct;
      fs::remove(Path(absl::StrCat("f", seed, direct)));
    }
  }
}

// EINVAL at any of the direct writes (a file system that takes O_DIRECT at the open only), or a short write of
// any length at one of them: the same file, and no error.
TEST_F(StreamFileTest, EinvalOrAShortWriteAtADirectWriteGivesTheSameFile) {
  int fired[2] = {0, 0};
  for (uint32_t seed = 0; seed < 200; ++seed) {
    for (int nth = 1; nth <= 4; ++nth) {
      for (Fault::Kind kind : {Fault::kEinvalDirect, Fault::kShortDirect}) {
        g_fault = Fault();
        g_fault.kind = kind;
        g_fault.nth = nth;
        const size_t shorts[] = {0, 1, 512, 4096, 4097, 8192};
        g_fault.short_bytes = shorts[(seed + nth) % std::size(shorts)];
        const std::string name = absl::StrCat("f", seed, "_", nth, "_", kind);
        const Outcome o = RandomFile(Path(name), seed, true);
        fired[kind == Fault::kShortDirect] += g_fault.fired;
        g_fault = Fault();
        ASSERT_TRUE(o.ok) << name;
        ASSERT_EQ(o.file.size(), o.model.size()) << name;
        ASSERT_TRUE(o.file == o.model) << name;
        fs::remove(Path(name));
      }
    }
  }
  if (DirectHere()) {
    EXPECT_GT(fired[0], 0);
    EXPECT_GT(fired[1], 0);
  }
}

std::vector<ShardRange> Ranges(std::vector<uint64_t> counts) {
  std::vector<ShardRange> out;
  for (size_t i = 0; i < counts.size(); ++i) out.push_back({"u", absl::StrCat("p", i), "master", 0, counts[i]});
  return out;
}

// ENOSPC at any write of a shard file (a direct block, the padded last one, the pending bytes turned
// buffered, the header): an error naming the temporary, no temporary left, nothing under the final name.
TEST_F(StreamFileTest, NoSpaceAtAnyWriteOfAShardLeavesNothing) {
  const std::vector<uint64_t> counts = {3000000, 1, 1025, 700000};
  bool every_write = false;
  for (int nth = 1; nth <= 12 && !every_write; ++nth) {
    const std::string path = Path(absl::StrCat("shard_", nth, ".bin"));
    absl::Status s;
    {
      auto w = ShardWriter::Create(path, 0, 1, Ranges(counts));
      ASSERT_TRUE(w.ok()) << w.status();
      g_fault.kind = Fault::kEnospc;
      g_fault.nth = nth;
      for (size_t i = 0; i < counts.size() && s.ok(); ++i) {
        std::vector<float> v(counts[i], static_cast<float>(i));
        s = w->Write(i, v.data());
      }
      if (s.ok()) s = w->Finish().status();
    }
    if (!s.ok()) {
      EXPECT_THAT(s.message(), HasSubstr(".tmp.")) << s;
    }
    every_write = !FailedCleanly(s, path, nth);
  }
  EXPECT_TRUE(every_write) << "a write was left without a fault";
}

TEST_F(StreamFileTest, AFailedTruncateAtFlushIsAnErrorNamingTheFile) {
  auto f = StreamFile::Create(Path("t.bin"), 0, true, StreamFile::kDirectAlign);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string bytes(5000, 'x');
  ASSERT_TRUE(f->Write(bytes.data(), bytes.size(), 0).ok());
  g_fault.kind = Fault::kFailTruncate;
  const absl::Status s = f->Flush();
  const bool direct_fs = g_fault.fired > 0;
  g_fault = Fault();
  if (!direct_fs) GTEST_SKIP() << "no O_DIRECT here";
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("t.bin"));
}

// ENOSPC at any write of an exported safetensors file: an error, no temporary, nothing under the final name.
TEST_F(StreamFileTest, NoSpaceAtAnyWriteOfASafetensorsFileLeavesNothing) {
  const std::vector<TensorToWrite> tensors = {{"a", {1000, 1000}}, {"b", {3}}, {"c", {300, 1000}}};
  bool every_write = false;
  for (int nth = 1; nth <= 12 && !every_write; ++nth) {
    const std::string path = Path(absl::StrCat("m", nth, ".safetensors"));
    g_fault.kind = Fault::kEnospc;
    g_fault.nth = nth;
    absl::Status s;
    {
      auto w = SafetensorsWriter::Begin(path, tensors);
      s = w.status();
      for (size_t i = 0; s.ok() && i < tensors.size(); ++i) {
        std::vector<float> v(tensors[i].numel(), 1.5f);
        s = w->WriteTensor(v);
      }
      if (s.ok()) s = w->Finish();
    }
    every_write = !FailedCleanly(s, path, nth);
  }
  EXPECT_TRUE(every_write) << "a write was left without a fault";
}

}  // namespace
}  // namespace strata::checkpoint
