// Safetensors files: the Hugging Face weight format. An 8-byte little-endian header length, a JSON
// header mapping tensor names to {dtype, shape, data_offsets} (offsets relative to the data section),
// then the raw little-endian data.
//
// The reader validates everything before any data is used (ParseSafetensorsHeader): header size and JSON
// (nesting, duplicate names), field types, dtypes, checked shape sizes, that each tensor's byte range
// matches its shape and lies inside the file, and that the ranges tile the data section (no overlap, gap or
// trailing byte: the format's rule), shapes of at most 64 dimensions. Every
// error names the file and the tensor. The writer streams tensors one at a time (a whole model is never
// staged in memory), writes to a temporary name, fsyncs and renames, so a crash never leaves a partial
// file under the final name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::checkpoint {

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16" (others are listed but cannot be read as fp32)
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets in the data section
  uint64_t end = 0;
  uint64_t numel() const;
};

// A validated header: tensors sorted by name, metadata.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Validates a header's JSON in one pass against a data section of `data_bytes`, before anything is
// allocated from it: nesting (<= 64) and duplicate names (json_text.h), each field's type, dtypes, shapes
// whose byte size overflows, data_offsets that disagree with shape x dtype, lie outside the data, overlap or
// leave bytes no tensor owns. DataLoss naming `path` and the tensor; never throws or aborts.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json, uint64_t data_bytes,
                                                         const std::string& path);

// The same for a whole file held in memory (length field, header, data): the fuzzers' entry point.
absl::Status ValidateSafetensorsHeader(std::string_view file_bytes);

class SafetensorsReader {
 public:
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;
  // Reads a tensor converted to fp32 (F32, BF16 and F16 are accepted).
  absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo& t) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  // Fills exactly numel floats for this tensor when the writer reaches it.
  std::function<absl::StatusOr<std::vector<float>>()> fetch;
};

// Writes F32 tensors in the given order. `metadata` goes to "__metadata__".
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::checkpoint
