// Safetensors files: the Hugging Face weight format. An 8-byte little-endian header length, a JSON
// header mapping tensor names to {dtype, shape, data_offsets} (offsets relative to the data section),
// then the raw little-endian data.
//
// The reader validates everything before any data is used (ParseSafetensorsHeader): header size and JSON
// (nesting, duplicate names), field types, dtypes, checked shape sizes, that each tensor's byte range
// matches its shape and lies inside the file, and that the ranges tile the data section (no overlap, gap or
// trailing byte: the format's rule), shapes of at most 64 dimensions. Every
// error names the file and the tensor. The writer (SafetensorsWriter) takes tensors one at a time from its
// caller (a whole model is never staged in memory), writes to a temporary name, fsyncs and renames, so a
// crash never leaves a partial file under the final name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/checkpoint/files.h"

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

// The name and shape of one F32 tensor a SafetensorsWriter writes.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel() const;
};

// Writes F32 tensors in the order given, streamed: the caller hands over each tensor's values in turn
// (WriteTensor), so one tensor is in memory at a time, and the writer only takes data (docs/design.md "Calls
// only descend"; it used to call a fetch function of each tensor back). Begin creates the file under a
// temporary name and writes the header; Finish fsyncs it and renames it to `path`. A writer destroyed before
// Finish (its caller failed) or whose write failed removes the temporary, so no partial file is ever left
// under the final name.
class SafetensorsWriter {
 public:
  // `metadata` goes to "__metadata__". Refuses to replace anything but a regular file.
  static absl::StatusOr<SafetensorsWriter> Begin(const std::string& path, std::vector<TensorToWrite> tensors,
                                                 const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) noexcept;
  ~SafetensorsWriter();

  // The tensor the next WriteTensor writes; nullptr once every tensor is written.
  const TensorToWrite* next() const { return next_ < tensors_.size() ? &tensors_[next_] : nullptr; }
  // The next tensor's values: exactly its numel() of them.
  absl::Status WriteTensor(absl::Span<const float> values);
  // After the last tensor: fsync, close and rename to the final path.
  absl::Status Finish();

 private:
  SafetensorsWriter() = default;
  void Abandon();                     // closes and removes the temporary, if it is open
  absl::Status Fail(absl::Status s);  // Abandon unless s is OK; returns s
  absl::Status CheckOpen(const char* what) const;

  absl::Status Append(const void* data, size_t n);  // at the end of what is written

  std::string path_, tmp_;
  StreamFile file_;  // Note [Direct checkpoint writes]
  uint64_t at_ = 0;  // bytes written
  std::vector<TensorToWrite> tensors_;
  size_t next_ = 0;
};

}  // namespace strata::checkpoint
