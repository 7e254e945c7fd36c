// Fuzzes the safetensors reader (runtime/checkpoint/safetensors.cc): a u64 little-endian header length,
// a JSON header of tensors, then raw data, from an untrusted weights file (`strata train --init-from`,
// `strata compare`). The input is the whole file. Properties beyond "no crash, leak or UB":
//  - a rejection of the file is DataLoss naming the file;
//  - every accepted tensor's byte span is exactly (product of its shape, computed without wrapping) x its
//    dtype's size, and lies inside the data section; accepted tensors tile the data section (no overlap, gap or
//    trailing byte);
//  - every accepted shape extent and data offset is the header's number exactly (json_exact.h);
//  - ReadF32 of an accepted F32/BF16/F16 tensor returns numel values; other dtypes are InvalidArgument.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/json_exact.h"

namespace {

uint64_t DTypeBytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  return 1;
}

// The span in bytes the shape and dtype need; false when it does not fit in 64 bits.
bool ExactBytes(const strata::checkpoint::TensorInfo& t, uint64_t* bytes) {
  uint64_t n = DTypeBytes(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

void ExpectExactNumbers(const uint8_t* data, uint64_t header_bytes, const strata::checkpoint::SafetensorsReader& r) {
  const auto j = nlohmann::json::parse(data + 8, data + 8 + header_bytes);
  for (const auto& t : r.tensors()) {
    const auto& e = j.at(t.name);
    const auto dump = [](const nlohmann::json& v) {
      return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    size_t d = 0;
    for (const auto& jd : e.at("shape")) {
      STRATA_FUZZ_EXPECT(d < t.shape.size() && strata::fuzz::SameNumber(jd, t.shape[d]),
                         "tensor '%s': accepted shape[%zu] from %s", t.name.c_str(), d, dump(jd).c_str());
      ++d;
    }
    const auto& off = e.at("data_offsets");
    STRATA_FUZZ_EXPECT(strata::fuzz::SameNumber(off.at(0), t.begin) && strata::fuzz::SameNumber(off.at(1), t.end),
                       "tensor '%s': accepted data_offsets [%llu, %llu] from %s", t.name.c_str(),
                       static_cast<unsigned long long>(t.begin), static_cast<unsigned long long>(t.end),
                       dump(off).c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile* const file = new strata::fuzz::MemFile();
  file->Set(data, size);
  auto reader = strata::checkpoint::SafetensorsReader::Open(file->path());
  if (!reader.ok()) {
    const absl::Status& s = reader.status();
    STRATA_FUZZ_EXPECT(s.code() == absl::StatusCode::kDataLoss, "unexpected error kind: %s", s.ToString().c_str());
    STRATA_FUZZ_EXPECT(s.message().find(file->path()) != absl::string_view::npos, "error does not name the file: %s",
                       s.ToString().c_str());
    return 0;
  }
  uint64_t header_bytes = 0;  // Open checked that the file holds 8 + this many bytes
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data[i];
  const uint64_t data_bytes = size - 8 - header_bytes;
  ExpectExactNumbers(data, header_bytes, *reader);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& t : reader->tensors()) {
    uint64_t bytes = 0;
    STRATA_FUZZ_EXPECT(ExactBytes(t, &bytes), "accepted tensor '%s' has a shape whose size does not fit 64 bits",
                       t.name.c_str());
    STRATA_FUZZ_EXPECT(t.end >= t.begin && t.end - t.begin == bytes && t.end <= data_bytes,
                       "accepted tensor '%s' spans [%llu, %llu) but needs %llu bytes (data section: %llu bytes)",
                       t.name.c_str(), static_cast<unsigned long long>(t.begin),
                       static_cast<unsigned long long>(t.end), static_cast<unsigned long long>(bytes),
                       static_cast<unsigned long long>(data_bytes));
    STRATA_FUZZ_EXPECT(reader->Find(t.name) != nullptr, "Find misses accepted tensor '%s'", t.name.c_str());
    if (t.begin != t.end) spans.emplace_back(t.begin, t.end);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;  // the non-empty tensors tile the data section: no overlap, gap or trailing byte
  for (const auto& [begin, end] : spans) {
    STRATA_FUZZ_EXPECT(begin == at, "accepted tensors overlap or leave a gap at data byte %llu",
                       static_cast<unsigned long long>(at));
    at = end;
  }
  STRATA_FUZZ_EXPECT(at == data_bytes, "accepted tensors leave %llu trailing data bytes",
                     static_cast<unsigned long long>(data_bytes - at));
  for (const auto& t : reader->tensors()) {
    auto values = reader->ReadF32(t);
    const bool readable = t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16";
    if (!readable) {
      STRATA_FUZZ_EXPECT(values.status().code() == absl::StatusCode::kInvalidArgument,
                         "ReadF32 of a %s tensor: %s", t.dtype.c_str(), values.status().ToString().c_str());
      continue;
    }
    STRATA_FUZZ_EXPECT(values.ok(), "ReadF32 of accepted tensor '%s' failed: %s", t.name.c_str(),
                       values.status().ToString().c_str());
    STRATA_FUZZ_EXPECT(values->size() == t.numel(), "ReadF32 of '%s' returned %zu values", t.name.c_str(),
                       values->size());
  }
  return 0;
}
