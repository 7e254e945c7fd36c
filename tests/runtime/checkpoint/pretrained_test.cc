// Tests for runtime/checkpoint/pretrained (Note [Pretrained by byte ranges]): a checkpoint directory (one file,
// or an index and its files) opens only when every file and the index are valid, each error naming the file and
// the tensor; a RangeReader hands over exactly the requested elements, converted from F32, BF16 and F16, through
// both I/O back-ends, reading exactly the requested bytes (the queue's own count) with any staging size; and
// every failure on the way (a dtype it does not convert, an injected I/O error, a file cut after it was opened, a
// sink's error) is an error naming its cause.
#include "runtime/checkpoint/pretrained.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "tests/runtime/checkpoint/test_dir.h"
#include "tests/runtime/checkpoint/write_tensors.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;

// A safetensors file of raw tensors {name, dtype, shape, bytes}, written as given (offsets in order).
struct Raw {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string FileOf(const std::vector<Raw>& tensors) {
  std::string header = "{";
  uint64_t at = 0;
  for (const Raw& t : tensors) {
    absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"", t.name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", at, ",", at + t.bytes.size(), "]}");
    at += t.bytes.size();
  }
  header += "}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  out += header;
  for (const Raw& t : tensors) out += t.bytes;
  return out;
}

std::string F32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
}
std::string U16(const std::vector<uint16_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), 2 * v.size());
}
std::vector<float> Iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i) * 0.25f;
  return v;
}

class Pretrained : public testing::TestDir {
 protected:
  // A sharded checkpoint: "a" (F32, 3000 elements) and "b" (BF16, 1000) in one file, "c" (F16, 5) in another.
  void WriteSharded(const std::string& dir) {
    a_ = Iota(3000, -100);
    for (size_t i = 0; i < 1000; ++i) b_.push_back(static_cast<uint16_t>(0x3f80 + (i % 64)));  // 1.0 ... in BF16
    c_ = {0x3c00, 0xc000, 0x3800, 0x0000, 0x7bff};  // 1, -2, 0.5, 0, 65504 in F16
    Write(dir + "/model-00001-of-00002.safetensors",
          FileOf({{"a", "F32", {30, 100}, F32(a_)}, {"b", "BF16", {1000}, U16(b_)}}));
    Write(dir + "/model-00002-of-00002.safetensors", FileOf({{"c", "F16", {5}, U16(c_)}}));
    Write(dir + "/model.safetensors.index.json",
          R"({"metadata": {"total_size": 14010}, "weight_map": {"a": "model-00001-of-00002.safetensors",)"
          R"( "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  }
  std::vector<float> a_;
  std::vector<uint16_t> b_, c_;
};

// Reads `ranges` through a RangeReader, handing each piece to sink(range, first, values, count) until the sink
// fails; the read's error, the sink's, or the stats.
template <typename Sink>
absl::StatusOr<RangeReadStats> ReadRangesF32(const PretrainedCheckpoint& c, absl::Span<const RangeToRead> ranges,
                                             const RangeReadOptions& o, Sink sink) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RangeReader> r, RangeReader::Open(c, ranges, o));
  while (true) {
    STRATA_ASSIGN_OR_RETURN(const bool more, r->Next());
    if (!more) break;
    STRATA_RETURN_IF_ERROR(sink(r->range(), r->first(), r->values().data(), r->values().size()));
  }
  return r->Finish();
}

// Reads `ranges` and returns {tag: values in order}.
std::map<int64_t, std::vector<float>> ReadAll(const PretrainedCheckpoint& c, const std::vector<RangeToRead>& ranges,
                                              const RangeReadOptions& o, RangeReadStats* stats) {
  std::map<int64_t, std::vector<float>> got;
  auto s = ReadRangesF32(c, ranges, o, [&](const RangeToRead& r, uint64_t first, const float* v, size_t n) {
    auto& out = got[r.tag];
    EXPECT_EQ(first, r.first + out.size()) << "pieces arrive in order";
    out.insert(out.end(), v, v + n);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok() && stats != nullptr) *stats = *s;
  return got;
}

TEST_F(Pretrained, ReadsExactlyTheRangesAskedForConvertedThroughBothBackends) {
  WriteSharded(Path("ck"));
  auto c = PretrainedCheckpoint::Open(Path("ck"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ((*c)->tensors().size(), 3u);
  ASSERT_EQ((*c)->files().size(), 2u);
  const size_t a = (*c)->Find("a") - (*c)->tensors().data(), b = (*c)->Find("b") - (*c)->tensors().data(),
               cc = (*c)->Find("c") - (*c)->tensors().data();
  const std::vector<RangeToRead> ranges = {
      {a, 7, 2500, 0}, {b, 999, 1, 1}, {b, 0, 300, 2}, {cc, 0, 5, 3}, {a, 0, 0, 4}};
  for (const offload::IoBackend backend : {offload::IoBackend::kThreads, offload::IoBackend::kAuto}) {
    for (const uint64_t staging : {uint64_t{4096}, uint64_t{1} << 20}) {
      RangeReadOptions o;
      o.backend = backend;
      o.staging_bytes = staging;
      o.staging_buffers = 2;
      o.request_bytes = staging == 4096 ? 1000 : 1 << 20;  // several requests per buffer, or one
      RangeReadStats stats;
      auto got = ReadAll(**c, ranges, o, &stats);
      EXPECT_EQ(got[0], std::vector<float>(a_.begin() + 7, a_.begin() + 2507));
      EXPECT_EQ(got[1], std::vector<float>{kernels::Bf16ToFloat(b_[999])});
      ASSERT_EQ(got[2].size(), 300u);
      for (size_t i = 0; i < 300; ++i) EXPECT_EQ(got[2][i], kernels::Bf16ToFloat(b_[i]));
      EXPECT_EQ(got[3], (std::vector<float>{1, -2, 0.5f, 0, 65504}));
      EXPECT_EQ(got.count(4), 0u) << "an empty range reads nothing";
      EXPECT_EQ(stats.bytes_read, 2500u * 4 + 2 + 600 + 10) << "exactly the ranges' bytes, " << stats.backend;
      EXPECT_EQ(stats.elements, 2500u + 1 + 300 + 5);
      if (backend == offload::IoBackend::kAuto && offload::UringCompiledIn()) {
        std::printf("%s: registered=%d fixed=%llu of %llu requests\n", stats.backend.c_str(), stats.registered,
                    static_cast<unsigned long long>(stats.fixed_buffer_ios),
                    static_cast<unsigned long long>(stats.requests));
      }
      if (stats.registered) {
        EXPECT_EQ(stats.fixed_buffer_ios, stats.requests) << stats.backend;
      }
      if (backend == offload::IoBackend::kThreads) {
        EXPECT_THAT(stats.backend, HasSubstr("threads"));
      }
    }
  }
}

TEST_F(Pretrained, ASingleFileAndADirectoryHoldingOneOpen) {
  Write("one/model.safetensors", FileOf({{"w", "F32", {2}, F32({1, 2})}}));
  for (const std::string& p : {Path("one"), Path("one/model.safetensors")}) {
    auto c = PretrainedCheckpoint::Open(p);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_NE((*c)->Find("w"), nullptr);
    float v[2];
    ASSERT_TRUE((*c)->ReadRaw(*(*c)->Find("w"), 0, v, 8).ok());
    EXPECT_EQ(v[1], 2.0f);
    EXPECT_EQ((*c)->ReadRaw(*(*c)->Find("w"), 4, v, 8).code(), absl::StatusCode::kOutOfRange);
  }
}

void ExpectOpenError(const std::string& path, absl::StatusCode code, const std::string& what) {
  auto c = PretrainedCheckpoint::Open(path);
  ASSERT_FALSE(c.ok()) << path;
  EXPECT_EQ(c.status().code(), code) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(what));
}

TEST_F(Pretrained, BadDirectoriesAndIndexesAreErrorsNamingTheFileAndTheTensor) {
  ExpectOpenError(Path("absent"), absl::StatusCode::kNotFound, "absent': No such file");
  std::filesystem::create_directories(Path("empty"));
  ExpectOpenError(Path("empty"), absl::StatusCode::kNotFound,
                  "neither model.safetensors nor model.safetensors.index.json");
  const std::string f1 = FileOf({{"a", "F32", {1}, F32({1})}, {"b", "F32", {1}, F32({2})}});
  const std::string f2 = FileOf({{"c", "F32", {1}, F32({3})}});
  auto index = [](const std::string& map) { return R"({"weight_map": {)" + map + "}}"; };
  Write("escape/x.safetensors", f1);
  Write("escape/model.safetensors.index.json", index(R"("a": "../x.safetensors", "b": "x.safetensors")"));
  ExpectOpenError(Path("escape"), absl::StatusCode::kDataLoss,
                  "tensor 'a' names the file '../x.safetensors', which is not a plain file name in the directory");
  Write("twice/model.safetensors.index.json", R"({"weight_map": {"a": "x", "a": "y"}})");
  ExpectOpenError(Path("twice"), absl::StatusCode::kDataLoss,
                  "model.safetensors.index.json': not a readable JSON index (duplicate index key 'weight_map.a')");
  Write("nomap/model.safetensors.index.json", R"({"weight_map": {}})");
  ExpectOpenError(Path("nomap"), absl::StatusCode::kDataLoss, "no \"weight_map\" object");
  Write("nofile/x.safetensors", f1);
  Write("nofile/model.safetensors.index.json", index(R"("a": "x.safetensors", "b": "x.safetensors", "c": "y.st")"));
  ExpectOpenError(Path("nofile"), absl::StatusCode::kNotFound, "nofile/y.st': No such file");
  Write("other/x.safetensors", f1);
  Write("other/y.safetensors", f2);
  Write("other/model.safetensors.index.json",
        index(R"("a": "y.safetensors", "b": "x.safetensors", "c": "y.safetensors")"));
  ExpectOpenError(Path("other"), absl::StatusCode::kDataLoss,
                  "other/x.safetensors': tensor 'a': the index names 'y.safetensors' for it");
  Write("lacks/x.safetensors", f1);
  Write("lacks/model.safetensors.index.json",
        index(R"("a": "x.safetensors", "b": "x.safetensors", "z": "x.safetensors")"));
  ExpectOpenError(Path("lacks"), absl::StatusCode::kDataLoss, "index.json': tensor 'z' is not in 'x.safetensors'");
  Write("both/x.safetensors", f1);
  Write("both/y.safetensors", FileOf({{"c", "F32", {1}, F32({3})}, {"a", "F32", {1}, F32({4})}}));
  Write("both/model.safetensors.index.json", index(R"("a": "x.safetensors", "b": "x.safetensors")"));
  // y.safetensors is not named by the index: not opened. Named (for "c"), its "a" is in two files.
  EXPECT_TRUE(PretrainedCheckpoint::Open(Path("both")).ok());
  Write("both/model.safetensors.index.json",
        index(R"("a": "x.safetensors", "b": "x.safetensors", "c": "y.safetensors")"));
  ExpectOpenError(Path("both"), absl::StatusCode::kDataLoss, "both/y.safetensors': tensor 'a': also in '");
  Write("cut/x.safetensors", f1.substr(0, f1.size() - 2));
  Write("cut/model.safetensors.index.json", index(R"("a": "x.safetensors", "b": "x.safetensors")"));
  ExpectOpenError(Path("cut"), absl::StatusCode::kDataLoss,
                  "cut/x.safetensors': tensor 'b': data_offsets [4, 8] do not hold");
}

TEST_F(Pretrained, TheIndexParserRefusesWhatIsNotAWeightMap) {
  for (const char* text :
       {"[]", "{}", R"({"weight_map": []})", R"({"weight_map": {"a": 3}})", R"({"weight_map": {"a": ""}})",
        R"({"weight_map": {"a": "/etc/passwd"}})", R"({"weight_map": {"a": ".."}})",
        "{\"weight_map\": {\"a\": \"x\\u0000y\"}}", "{", R"({"weight_map": {"a": "x"}, "weight_map": {"b": "y"}})"}) {
    auto m = ParseSafetensorsIndex(text, "i.json");
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("'i.json': ")) << text;
  }
  auto m = ParseSafetensorsIndex(R"({"metadata": {"x": 1}, "weight_map": {"a": "f", "b": "g"}})", "i.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (std::map<std::string, std::string>{{"a", "f"}, {"b", "g"}}));
}

TEST_F(Pretrained, EveryFailureOfAReadIsAnErrorNamingItsCause) {
  WriteSharded(Path("ck"));
  Write("ck64/model.safetensors", FileOf({{"d", "F64", {2}, std::string(16, '\0')}}));
  auto d = PretrainedCheckpoint::Open(Path("ck64"));
  ASSERT_TRUE(d.ok()) << d.status();
  auto refuse = ReadRangesF32(**d, {{0, 0, 2, 0}}, {}, [](auto&&...) { return absl::OkStatus(); });
  EXPECT_EQ(refuse.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refuse.status().message()),
              HasSubstr("model.safetensors': tensor 'd' is F64; a parameter is read from F32, BF16 or F16"));
  auto c = PretrainedCheckpoint::Open(Path("ck"));
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t a = (*c)->Find("a") - (*c)->tensors().data();
  auto beyond = ReadRangesF32(**c, {{a, 2999, 2, 0}}, {}, [](auto&&...) { return absl::OkStatus(); });
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kOutOfRange);

  for (const offload::IoBackend backend : {offload::IoBackend::kThreads, offload::IoBackend::kAuto}) {
    RangeReadOptions o;
    o.backend = backend;
    o.staging_bytes = 4096;
    o.faults.fail_request = 2;  // the second request fails as if the kernel said EIO
    auto io = ReadRangesF32(**c, {{a, 0, 3000, 0}}, o, [](auto&&...) { return absl::OkStatus(); });
    ASSERT_FALSE(io.ok());
    EXPECT_THAT(std::string(io.status().message()), HasSubstr("model-00001-of-00002.safetensors")) << io.status();
    EXPECT_THAT(std::string(io.status().message()), HasSubstr("Input/output error")) << io.status();

    int calls = 0;
    o.faults = offload::IoFaults{};
    o.request_bytes = 1024;  // 3 requests per 4096-byte buffer
    auto sink = ReadRangesF32(**c, {{a, 0, 3000, 0}}, o, [&](auto&&...) {
      return ++calls == 2 ? absl::AbortedError("sink says no") : absl::OkStatus();
    });
    EXPECT_EQ(sink.status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(calls, 2) << "no piece after the sink's error";
  }
  // The file cut after it was opened: the read past its new end is DataLoss naming it.
  ASSERT_EQ(::truncate(Path("ck/model-00001-of-00002.safetensors").c_str(), 1000), 0);
  auto cut = ReadRangesF32(**c, {{a, 0, 3000, 0}}, {}, [](auto&&...) { return absl::OkStatus(); });
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("model-00001-of-00002.safetensors"));
}

TEST_F(Pretrained, ADirectoryWrittenInShardsReadsBackAndARewriteLeavesNoStaleFile) {
  std::vector<std::vector<float>> values = {Iota(1024, 0), Iota(1024, 1), Iota(8, 2), Iota(1024, 3)};
  std::vector<testing::SourceTensor> tensors;
  for (size_t i = 0; i < values.size(); ++i) {
    tensors.push_back({absl::StrCat("t", i), {static_cast<int64_t>(values[i].size())}, [&values, i]() {
                         return absl::StatusOr<std::vector<float>>(values[i]);
                       }});
  }
  // 4096 + 4096 > 6000: t0 alone; t1 + t2 (4128); t3.
  auto names = testing::WriteTensorsDir(Path("out"), tensors, 6000, {{"format", "pt"}});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                              "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  auto c = PretrainedCheckpoint::Open(Path("out"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ((*c)->files().size(), 3u);
  for (size_t i = 0; i < values.size(); ++i) {
    const auto* t = (*c)->Find(absl::StrCat("t", i));
    ASSERT_NE(t, nullptr);
    std::vector<float> got(values[i].size());
    ASSERT_TRUE((*c)->ReadRaw(*t, 0, got.data(), 4 * got.size()).ok());
    EXPECT_EQ(got, values[i]) << i;
  }
  EXPECT_EQ((*c)->files()[(*c)->Find("t2")->file].path, (*c)->files()[(*c)->Find("t1")->file].path);
  // The same tensors in one file: the earlier shards and index are gone (a reader would otherwise meet both).
  Write("out/unrelated.txt", "kept");
  names = testing::WriteTensorsDir(Path("out"), tensors, 1 << 20, {});
  ASSERT_TRUE(names.ok()) << names.status();
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(Path("out"))) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"model.safetensors", "unrelated.txt"}));
  EXPECT_EQ(testing::WriteTensorsDir(Path("out"), tensors, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// The directory writer driven out of turn (docs/decisions/0047): each misuse is an error naming the directory;
// no tensors at all is one model.safetensors that reads back as no tensors.
TEST_F(Pretrained, TheDirectoryWriterRefusesMisuse) {
  const std::vector<TensorToWrite> shapes = {{"t0", {1024}}, {"t1", {8}}};
  auto w = SafetensorsDirWriter::Begin(Path("out"), shapes, 6000, {});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->WriteTensor(Iota(1024, 0)).ok());
  auto early = w->Finish();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("finished after 1 of 2 tensors"));
  EXPECT_THAT(std::string(early.status().message()), HasSubstr(Path("out")));
  ASSERT_TRUE(w->WriteTensor(Iota(8, 0)).ok());
  const absl::Status more = w->WriteTensor(Iota(8, 0));
  EXPECT_EQ(more.code(), absl::StatusCode::kFailedPrecondition) << more;
  EXPECT_THAT(std::string(more.message()), HasSubstr("a tensor written after 2 of 2"));
  auto names = w->Finish();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"model.safetensors"});

  auto none = SafetensorsDirWriter::Begin(Path("none"), {}, 6000, {});
  ASSERT_TRUE(none.ok()) << none.status();
  names = none->Finish();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"model.safetensors"});
  // Its header is the empty object, which the reader takes: a file of no tensors.
  auto read = SafetensorsReader::Open(Path("none/model.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->tensors().empty());
}

// The reader driven out of turn: Finish before the last piece is an error, a read's error comes back again from
// every later Next, and a reader dropped after its first piece is destroyed cleanly (it waits for its reads in
// flight).
TEST_F(Pretrained, TheRangeReaderRefusesAnEarlyFinishAndRepeatsAReadError) {
  WriteSharded(Path("ck"));
  auto c = PretrainedCheckpoint::Open(Path("ck"));
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t a = (*c)->Find("a") - (*c)->tensors().data();
  RangeReadOptions o;
  o.staging_bytes = 4096;
  o.staging_buffers = 2;
  auto r = RangeReader::Open(**c, {{a, 0, 3000, 0}}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto more = (*r)->Next();
  ASSERT_TRUE(more.ok() && *more) << more.status();
  EXPECT_EQ((*r)->first(), 0u);
  EXPECT_EQ(std::vector<float>((*r)->values().begin(), (*r)->values().end()),
            std::vector<float>(a_.begin(), a_.begin() + (*r)->values().size()));
  auto early = (*r)->Finish();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("before the last piece"));
  r->reset();  // dropped early: waits for its reads in flight

  o.faults.fail_request = 1;
  auto failing = RangeReader::Open(**c, {{a, 0, 3000, 0}}, o);
  ASSERT_TRUE(failing.ok()) << failing.status();
  auto first = (*failing)->Next();
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("Input/output error"));
  auto again = (*failing)->Next();
  EXPECT_EQ(again.status(), first.status());
  EXPECT_EQ((*failing)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::checkpoint
