// Tests' safetensors files: each tensor with a function that makes its values, written through
// SafetensorsWriter / SafetensorsDirWriter by the loop their callers run (tools/ckpt, models/gpt/weights): the
// values of one tensor at a time, handed to the writer in order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/checkpoint/safetensors.h"

namespace strata::checkpoint::testing {

struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<absl::StatusOr<std::vector<float>>()> values;
};

inline std::vector<TensorToWrite> ShapesOf(const std::vector<SourceTensor>& tensors) {
  std::vector<TensorToWrite> out;
  for (const SourceTensor& t : tensors) out.push_back({t.name, t.shape});
  return out;
}

template <typename Writer>
absl::Status WriteEach(Writer& w, const std::vector<SourceTensor>& tensors) {
  for (const SourceTensor& t : tensors) {
    STRATA_ASSIGN_OR_RETURN(const std::vector<float> values, t.values());
    STRATA_RETURN_IF_ERROR(w.WriteTensor(values));
  }
  return absl::OkStatus();
}

inline absl::Status WriteTensors(const std::string& path, const std::vector<SourceTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata = {}) {
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::Begin(path, ShapesOf(tensors), metadata));
  STRATA_RETURN_IF_ERROR(WriteEach(w, tensors));
  return w.Finish();
}

inline absl::StatusOr<std::vector<std::string>> WriteTensorsDir(const std::string& dir,
                                                                const std::vector<SourceTensor>& tensors,
                                                                uint64_t max_shard_bytes,
                                                                const std::map<std::string, std::string>& metadata) {
  STRATA_ASSIGN_OR_RETURN(SafetensorsDirWriter w,
                          SafetensorsDirWriter::Begin(dir, ShapesOf(tensors), max_shard_bytes, metadata));
  STRATA_RETURN_IF_ERROR(WriteEach(w, tensors));
  return w.Finish();
}

}  // namespace strata::checkpoint::testing
