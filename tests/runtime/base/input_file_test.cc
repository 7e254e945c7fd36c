// Tests for runtime/base/input_file: a directory is a clear error naming the path (it used to read as an
// empty file or crash the reader), a missing file is NotFound, and a regular file reads whole. A device
// (/dev/zero aborted with bad_alloc), a FIFO given as a config (it hung with no writer), a file above the
// cap (an 8 TiB sparse file aborted in reserve()) and an empty config file are refused naming the path.
#include "runtime/base/input_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(ReadInputFile, ADirectoryIsAnErrorNamingThePath) {
  const std::string dir = ::testing::TempDir() + "/strata_input_dir";
  ::mkdir(dir.c_str(), 0755);
  auto r = ReadInputFile(dir, "config file", kMaxConfigFileBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("config file '" + dir + "' is a directory, not a file"));
}

TEST(ReadInputFile, MissingIsNotFoundAndAFileReadsWhole) {
  auto missing = ReadInputFile("/nonexistent/strata.json", "data file", kMaxConfigFileBytes);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cannot open data file '/nonexistent/strata.json'"));
  const std::string path = ::testing::TempDir() + "/strata_input_file.bin";
  std::string bytes(200000, 'x');
  bytes[7] = '\0';
  std::ofstream(path, std::ios::binary) << bytes;
  auto r = ReadInputFile(path, "data file", bytes.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, bytes);
}

TEST(ReadInputFile, ADeviceIsNotARegularFile) {
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    auto r = ReadInputFile(dev, "data file", MaxTokenFileBytes(), InputKind::kRegularFileOrFifo);
    ASSERT_FALSE(r.ok()) << dev;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("data file '" + std::string(dev) + "' is not a regular file"));
  }
  const std::string link = ::testing::TempDir() + "/strata_input_zero_link";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink("/dev/zero", link.c_str()), 0);
  auto r = ReadConfigFile(link);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("config file '" + link + "' is not a regular file"));
}

TEST(ReadInputFile, AFifoIsRefusedForAConfigWithoutWaitingForAWriter) {
  const std::string fifo = ::testing::TempDir() + "/strata_input_fifo_config";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ReadConfigFile(fifo);  // no writer: opening it would block forever
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("config file '" + fifo + "' is not a regular file"));
}

TEST(ReadInputFile, AFileAboveTheCapIsRefusedFromItsSizeBeforeAllocating) {
  const std::string path = ::testing::TempDir() + "/strata_input_sparse.bin";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  const off_t huge = off_t{8} << 40;  // 8 TiB, sparse: reserve() of its size threw bad_alloc
  const bool sparse = ::ftruncate(fd, huge) == 0;
  if (!sparse) {
    ASSERT_EQ(::ftruncate(fd, 4097), 0);
  }
  ::close(fd);
  const uint64_t cap = sparse ? MaxTokenFileBytes() : 4096;
  auto r = ReadInputFile(path, "data file", cap);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr(absl::StrCat("data file '", path, "' is ", sparse ? uint64_t(huge) : 4097,
                                     " bytes, above the limit of ", cap, " bytes")));
  if (sparse) {
    auto c = ReadConfigFile(path);
    ASSERT_FALSE(c.ok());
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(absl::StrCat("above the limit of ", kMaxConfigFileBytes)));
  }
  ::unlink(path.c_str());
  EXPECT_LE(MaxTokenFileBytes(), uint64_t{64} << 30);
  EXPECT_GT(MaxTokenFileBytes(), 0u);
}

TEST(ReadInputFile, AFifoIsReadWithTheCapEnforcedAsItFlows) {
  const std::string fifo = ::testing::TempDir() + "/strata_input_fifo_data";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::signal(SIGPIPE, SIG_IGN);  // the writer sees EPIPE, not a signal, when the reader stops at the cap
  for (const size_t n : {size_t{1000}, size_t{300000}}) {
    std::thread writer([&] {
      const int fd = ::open(fifo.c_str(), O_WRONLY);
      const std::string bytes(n, 'a');
      size_t done = 0;
      while (fd >= 0 && done < n) {
        const ssize_t w = ::write(fd, bytes.data() + done, n - done);
        if (w <= 0) break;  // the reader stopped at the cap (EPIPE)
        done += static_cast<size_t>(w);
      }
      if (fd >= 0) ::close(fd);
    });
    auto r = ReadInputFile(fifo, "data file", 100000, InputKind::kRegularFileOrFifo);
    writer.join();
    if (n <= 100000) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(*r, std::string(n, 'a'));
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_THAT(std::string(r.status().message()),
                  HasSubstr("data file '" + fifo + "' is more than 100000 bytes, above the limit of 100000 bytes"));
    }
  }
}

TEST(ReadConfigFile, AnEmptyConfigFileIsAnError) {
  for (const std::string text : {"", "  \n\t"}) {
    const std::string path = ::testing::TempDir() + "/strata_input_empty.json";
    std::ofstream(path, std::ios::binary) << text;
    auto r = ReadConfigFile(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("config file '" + path + "' is empty"));
  }
  const std::string path = ::testing::TempDir() + "/strata_input_ok.json";
  std::ofstream(path, std::ios::binary) << "{}";
  auto r = ReadConfigFile(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "{}");
}

}  // namespace
}  // namespace strata
