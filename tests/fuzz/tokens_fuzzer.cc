// Fuzzes the GPT trainer's token-file reader (models/gpt/data/data.cc, LoadTokens): an llm.c token file
// (a 256 x int32 header: magic 20240520, version, token count; then uint16 tokens) or, for any other
// bytes, plain text read one token per byte. The input is the whole file. Properties beyond "no crash,
// leak or UB":
//  - a rejection is InvalidArgument or DataLoss naming the file;
//  - accepted tokens are inside [0, vocab), and there are as many as the header promises (llm.c) or as
//    the file has bytes (text).
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "models/gpt/data/data.h"
#include "tests/fuzz/fuzz_file.h"

// data.cc also serves the embedded default corpus, which the build assembles into the GPT library from
// data/corpus.txt; this harness links data.cc alone and never asks for it (the path is never empty), so
// an empty corpus stands in.
extern "C" {
extern const char strata_corpus_begin[];
extern const char strata_corpus_end[];
const char strata_corpus_begin[] = "";
const char strata_corpus_end[] = "";
}

namespace {

constexpr int kVocab = 50257;  // GPT-2's
constexpr int32_t kLlmcMagic = 20240520;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile* const file = new strata::fuzz::MemFile();
  file->Set(data, size);
  auto tokens = strata::gpt::LoadTokens(file->path(), kVocab);
  if (!tokens.ok()) {
    const absl::Status& s = tokens.status();
    STRATA_FUZZ_EXPECT(s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kDataLoss,
                       "unexpected error kind: %s", s.ToString().c_str());
    STRATA_FUZZ_EXPECT(s.message().find(file->path()) != absl::string_view::npos, "error does not name the file: %s",
                       s.ToString().c_str());
    return 0;
  }
  int32_t magic = 0, count = 0;
  if (size >= 1024) {
    std::memcpy(&magic, data, 4);
    std::memcpy(&count, data + 8, 4);
  }
  const size_t expected = magic == kLlmcMagic ? static_cast<size_t>(count) : size;
  STRATA_FUZZ_EXPECT(tokens->size() == expected, "%zu tokens, expected %zu", tokens->size(), expected);
  for (int32_t t : *tokens) STRATA_FUZZ_EXPECT(t >= 0 && t < kVocab, "token %d outside [0, %d)", t, kVocab);
  return 0;
}
