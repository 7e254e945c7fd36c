// Tests for runtime/checkpoint/safetensors: the header is validated in one pass before anything is
// allocated from it. Each hostile header below (an overflowing shape, offsets that disagree with the
// shape, lie outside the file or overlap, a tensor named twice, wrong field types, deep nesting, a
// length field larger than the file) is a DataLoss error naming the file and the tensor, from the file
// reader and from the in-memory validator alike; a file the writer made reads back bit for bit.
#include "runtime/checkpoint/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/checkpoint/write_tensors.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;

std::string FileBytes(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Expects the reader and the in-memory validator both to refuse `bytes` with DataLoss containing `what`.
void ExpectCorrupt(const std::string& name, const std::string& bytes, const std::string& what) {
  const std::string path = Write(name, bytes);
  auto r = SafetensorsReader::Open(path);
  ASSERT_FALSE(r.ok()) << name;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path)) << name;
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(what)) << name;
  const absl::Status v = ValidateSafetensorsHeader(bytes);
  EXPECT_FALSE(v.ok()) << name;
  EXPECT_THAT(std::string(v.message()), HasSubstr(what)) << name;
}

TEST(Safetensors, WrittenFilesReadBackAndValidate) {
  const std::string path = ::testing::TempDir() + "/ok.safetensors";
  std::vector<testing::SourceTensor> tensors = {
      {"a",
       {2, 3},
       [] {
         return absl::StatusOr<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
       }},
      {"b", {1}, [] { return absl::StatusOr<std::vector<float>>(std::vector<float>{-0.5f}); }}};
  ASSERT_TRUE(testing::WriteTensors(path, tensors, {{"format", "pt"}}).ok());
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(r->metadata().at("format"), "pt");
  auto a = r->ReadF32(*r->Find("a"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, std::vector<float>({1, 2, 3, 4, 5, 6}));
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  EXPECT_TRUE(ValidateSafetensorsHeader(bytes).ok());
}

// Nothing but a finished file appears under the path (no temporary is left either way).
std::vector<std::string> FilesStartingWith(const std::string& path) {
  std::vector<std::string> out;
  const std::filesystem::path p(path);
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(p.filename().string(), 0) == 0) out.push_back(name);
  }
  return out;
}

// The caller drives the writer (docs/decisions/0047): each misuse and each failure of its own is an error naming
// the file or the tensor, and leaves neither the file nor its temporary behind.
TEST(Safetensors, TheStreamingWriterRefusesMisuseAndLeavesNoPartialFile) {
  const std::string path = ::testing::TempDir() + "/stream.safetensors";
  ::unlink(path.c_str());
  const std::vector<TensorToWrite> shapes = {{"a", {2, 3}}, {"b", {1}}};
  const std::vector<float> six = {1, 2, 3, 4, 5, 6};
  {  // a tensor with the wrong number of values
    auto w = SafetensorsWriter::Begin(path, shapes);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->next()->name, "a");
    const absl::Status s = w->WriteTensor(absl::MakeConstSpan(six).subspan(0, 3));
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'a' produced 3 values for 6"));
    EXPECT_TRUE(FilesStartingWith(path).empty()) << "the temporary went with the failure";
    const absl::Status after = w->WriteTensor(six);
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
    EXPECT_THAT(std::string(after.message()), HasSubstr(path));
    EXPECT_EQ(w->Finish().code(), absl::StatusCode::kFailedPrecondition);
  }
  {  // finished before its last tensor
    auto w = SafetensorsWriter::Begin(path, shapes);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->WriteTensor(six).ok());
    const absl::Status s = w->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("finished after 1 of its 2 tensors"));
    EXPECT_TRUE(FilesStartingWith(path).empty());
  }
  {  // a tensor more than it has
    auto w = SafetensorsWriter::Begin(path, {{"a", {1}}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->WriteTensor(std::vector<float>{1}).ok());
    EXPECT_EQ(w->next(), nullptr);
    const absl::Status s = w->WriteTensor(std::vector<float>{2});
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("a tensor written after its 1 tensors"));
    EXPECT_TRUE(FilesStartingWith(path).empty());
  }
  {  // dropped by its caller (the caller's own error) before Finish
    auto w = SafetensorsWriter::Begin(path, shapes);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->WriteTensor(six).ok());
    EXPECT_EQ(FilesStartingWith(path).size(), 1u) << "the temporary, while it writes";
  }
  EXPECT_TRUE(FilesStartingWith(path).empty());
  // Moved, it is still one file, written once.
  auto w = SafetensorsWriter::Begin(path, shapes);
  ASSERT_TRUE(w.ok()) << w.status();
  SafetensorsWriter moved = std::move(*w);
  ASSERT_TRUE(moved.WriteTensor(six).ok());
  ASSERT_TRUE(moved.WriteTensor(std::vector<float>{-0.5f}).ok());
  ASSERT_TRUE(moved.Finish().ok());
  EXPECT_EQ(FilesStartingWith(path), std::vector<std::string>{"stream.safetensors"});
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->ReadF32(*r->Find("b")), std::vector<float>{-0.5f});
}

// --save-weights and `ckpt export -o` onto a FIFO once replaced it with a regular file.
TEST(Safetensors, WritingRefusesToReplaceAFifo) {
  const std::string path = ::testing::TempDir() + "/pipe.safetensors";
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::vector<testing::SourceTensor> tensors = {
      {"a", {1}, [] { return absl::StatusOr<std::vector<float>>(std::vector<float>{1}); }}};
  const absl::Status s = testing::WriteTensors(path, tensors, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a FIFO"));
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ::unlink(path.c_str());
}

TEST(Safetensors, AShapeWhoseByteSizeOverflowsIsRefused) {
  // 2^62 x 4 bytes wraps to 0, which would match empty data_offsets without the checked product.
  ExpectCorrupt("overflow.safetensors",
                FileBytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
                "tensor 'w' has shape [4611686018427387904], whose byte size overflows 64 bits");
  ExpectCorrupt("overflow2.safetensors",
                FileBytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0),
                "overflows 64 bits");
}

TEST(Safetensors, OffsetsMustMatchTheShapeLieInsideAndNotOverlap) {
  ExpectCorrupt("span.safetensors", FileBytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
                "tensor 'w' has data_offsets [0, 4] but its shape and F32 need 8 bytes");
  ExpectCorrupt("reversed.safetensors", FileBytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
                "tensor 'w' has data_offsets [8, 0]");
  ExpectCorrupt("outside.safetensors", FileBytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                "tensor 'w': data_offsets [0, 16] do not hold its bytes within the 8 data bytes of the file "
                "(truncated file?)");
  ExpectCorrupt("overlap.safetensors",
                FileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                "tensors 'a' and 'b' overlap");
}

// The format's rule: the tensors tile the data section. A byte-range reader never reads bytes no tensor owns.
TEST(Safetensors, TensorsMustTileTheDataWithoutGapsOrTrailingBytes) {
  ExpectCorrupt("gap.safetensors",
                FileBytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12),
                "tensor 'b' starts at data byte 8, expected 4 (the tensors must tile the data without gaps)");
  ExpectCorrupt("late.safetensors", FileBytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "tensor 'a' starts at data byte 4, expected 0");
  ExpectCorrupt("trailing.safetensors", FileBytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12),
                "the tensors hold 4 data bytes and the file has 12");
  std::string dims = "[1";
  for (int i = 0; i < 64; ++i) dims += ",1";
  ExpectCorrupt("dims.safetensors",
                FileBytes(R"({"a":{"dtype":"F32","shape":)" + dims + R"(],"data_offsets":[0,4]}})", 4),
                "tensor 'a' shape has 65 dimensions, more than 64");
  // Empty tensors anywhere, and an empty data section, tile.
  EXPECT_TRUE(ValidateSafetensorsHeader(FileBytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                                  4))
                  .ok());
  EXPECT_TRUE(ValidateSafetensorsHeader(FileBytes(R"({})", 0)).ok());
}

TEST(Safetensors, ATensorNamedTwiceIsRefusedNamingIt) {
  ExpectCorrupt("dup.safetensors",
                FileBytes(R"({"wte.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("wte.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "duplicate header key 'wte.weight'");
}

TEST(Safetensors, EveryFieldHasItsType) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "tensor 'w' dtype is not a string"},
      {R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "tensor 'w' shape is not an array"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "shape holds 1.5"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape holds -1"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", "data_offsets must be two non-negative"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "data_offsets must be two non-negative"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "data_offsets must be two non-negative"},
      {R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", "unknown dtype 'Q4'"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "lacks dtype, shape or data_offsets"},
      {R"({"w":[1]})", "lacks dtype, shape or data_offsets"},
      {R"({"__metadata__":{"format":1}})", "__metadata__ 'format' is not a string"},
      {R"({"__metadata__":[]})", "__metadata__ is not an object"},
      {R"([1,2])", "not a JSON object"},
      {R"({"w":)", "malformed header JSON"},
  };
  int i = 0;
  for (const auto& [header, what] : cases)
    ExpectCorrupt("type" + std::to_string(i++) + ".safetensors", FileBytes(header, 8), what);
}

TEST(Safetensors, NestingAndTheLengthFieldAreBounded) {
  ExpectCorrupt("deep.safetensors", FileBytes(R"({"__metadata__":)" + std::string(100000, '[') + "}", 0),
                "header JSON nests deeper than 64 levels");
  std::string huge = FileBytes("{}", 0);
  huge[7] = '\x7f';  // a length of about 2^63
  ExpectCorrupt("length.safetensors", huge, "does not fit a 10-byte file");
  ExpectCorrupt("short.safetensors", std::string(5, '\0'), "too short for a header");
  EXPECT_FALSE(ValidateSafetensorsHeader("").ok());
}

TEST(Safetensors, ADirectoryIsNamed) {
  auto r = SafetensorsReader::Open(::testing::TempDir());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is a directory"));
}

// A FIFO with no writer hung the open; /dev/zero read as a file of unknown size.
TEST(Safetensors, ADeviceOrFifoIsNotARegularFile) {
  const std::string fifo = ::testing::TempDir() + "/weights_fifo.safetensors";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    auto r = SafetensorsReader::Open(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("safetensors file '" + path + "' is not a regular file"));
  }
  ::unlink(fifo.c_str());
}

}  // namespace
}  // namespace strata::checkpoint
