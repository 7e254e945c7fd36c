// Tests for runtime/base/input_file: a directory is a clear error naming the path (it used to read as an
// empty file or crash the reader), a missing file is NotFound, and a regular file reads whole.
#include "runtime/base/input_file.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(ReadInputFile, ADirectoryIsAnErrorNamingThePath) {
  const std::string dir = ::testing::TempDir() + "/strata_input_dir";
  ::mkdir(dir.c_str(), 0755);
  auto r = ReadInputFile(dir, "config file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("config file '" + dir + "' is a directory, not a file"));
}

TEST(ReadInputFile, MissingIsNotFoundAndAFileReadsWhole) {
  auto missing = ReadInputFile("/nonexistent/strata.json", "data file");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cannot open data file '/nonexistent/strata.json'"));
  const std::string path = ::testing::TempDir() + "/strata_input_file.bin";
  std::string bytes(200000, 'x');
  bytes[7] = '\0';
  std::ofstream(path, std::ios::binary) << bytes;
  auto r = ReadInputFile(path, "data file");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, bytes);
}

}  // namespace
}  // namespace strata
