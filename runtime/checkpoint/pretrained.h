// Pretrained weights in the Hugging Face layout, read by byte ranges through the offload layer's reader.
//
// Note [Pretrained by byte ranges]. A checkpoint is one `.safetensors` file, or a directory holding
// `model.safetensors`, or `model.safetensors.index.json` and the files its "weight_map" names (what
// transformers' save_pretrained and engine.save_pretrained write). Every byte is untrusted input
// (docs/decisions/0009, 0010, 0037): the index is parsed by ParseSafetensorsIndex (at most 100 MB, guarded JSON,
// a non-empty "weight_map" object of tensor names to plain file names in the directory); each file's header by
// ParseSafetensorsHeader (safetensors.h: shapes, dtypes, offsets, the tensors tiling the data); a tensor in two
// files, a tensor in a file the index does not name for it, and an index entry its file lacks are errors naming
// the file and the tensor. Nothing is read from a tensor's data until every file of the checkpoint passed.
//
// Then ReadRangesF32 reads only the element ranges it is asked for (a rank's held part of each parameter),
// through an offload::IoQueue: io_uring with its staging buffers registered (READ_FIXED), or the queue's
// pread thread pool where io_uring is not built or refused (io_queue.h). The ranges are cut into read requests
// of at most 1 MiB, packed into one batch per staging buffer, several buffers in flight (by default 4 x 8 MiB:
// 32 requests of 1 MiB, the depth and block of the fio reference in docs/perf-notes.md); each completed buffer is
// converted to fp32 (F32, BF16, F16; any other dtype is refused before any I/O, naming the tensor) and handed
// to the caller's sink, in order of the ranges. The bytes it reads are exactly the ranges' bytes (the queue's
// stats count them: RangeReadStats::bytes_read), so a rank reads nothing of the parts other ranks keep.
// A file shortened after it was opened is DataLoss naming it (the queue's end-of-file rule).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/offload/io_queue.h"
#include "runtime/checkpoint/safetensors.h"

namespace strata::checkpoint {

inline constexpr char kSafetensorsFileName[] = "model.safetensors";
inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

// The "weight_map" of an index (tensor name -> file name), validated: DataLoss naming `path` otherwise.
// The fuzzers' entry point for the index.
absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view json_text,
                                                                         const std::string& path);

class PretrainedCheckpoint {
 public:
  struct File {
    std::string path;
    int fd = -1;
    uint64_t data_start = 0;  // 8 + header length
    uint64_t data_bytes = 0;
  };
  struct Tensor {
    TensorInfo info;
    int file = 0;
  };

  // `path`: a .safetensors file or a checkpoint directory (see the Note). NotFound for a directory with
  // neither file or a missing file, DataLoss for a damaged one; each message names the file.
  static absl::StatusOr<std::unique_ptr<PretrainedCheckpoint>> Open(const std::string& path);
  ~PretrainedCheckpoint();
  PretrainedCheckpoint(const PretrainedCheckpoint&) = delete;
  PretrainedCheckpoint& operator=(const PretrainedCheckpoint&) = delete;

  const std::vector<File>& files() const { return files_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // sorted by name
  const Tensor* Find(std::string_view name) const;
  // Raw bytes [offset, offset + bytes) of a tensor's data (its dtype), with pread: for small whole tensors
  // (buffers); OutOfRange beyond the tensor, DataLoss when the file ended early.
  absl::Status ReadRaw(const Tensor& t, uint64_t offset, void* out, uint64_t bytes) const;

 private:
  PretrainedCheckpoint() = default;
  absl::Status AddFile(const std::string& path, const std::map<std::string, std::string>* weight_map,
                       const std::string& name);

  std::vector<File> files_;
  std::vector<Tensor> tensors_;
};

// OK when tensor `tensor` (an index into tensors()) is F32, BF16 or F16, which ReadRangesF32 converts; else
// InvalidArgument naming the file, the tensor and its dtype.
absl::Status CheckReadableAsF32(const PretrainedCheckpoint& checkpoint, size_t tensor);

// Elements [first, first + count) of tensor `tensor` (an index into tensors()); `tag` is the caller's.
struct RangeToRead {
  size_t tensor = 0;
  uint64_t first = 0;
  uint64_t count = 0;
  int64_t tag = 0;
};

// Receives, in order, fp32 values of elements [first, first + count) of `range`'s tensor (a piece of it).
using RangeSink =
    std::function<absl::Status(const RangeToRead& range, uint64_t first, const float* values, size_t count)>;

struct RangeReadOptions {
  offload::IoBackend backend = offload::IoBackend::kAuto;
  uint32_t depth = 32;                // requests in the kernel at once
  uint64_t staging_bytes = 8u << 20;  // per buffer, rounded up to 4096
  uint32_t staging_buffers = 4;       // buffers in flight
  uint64_t request_bytes = 1u << 20;  // at most this many bytes per read request (a buffer holds several)
  offload::IoFaults faults;           // test hook (io_queue.h)
};

struct RangeReadStats {
  uint64_t bytes_read = 0;        // bytes the queue moved from the files
  uint64_t requests = 0;          // read requests submitted
  uint64_t fixed_buffer_ios = 0;  // of them, issued as READ_FIXED on registered buffers
  uint64_t elements = 0;          // elements handed to the sink
  bool registered = false;        // the staging buffers were registered with the queue
  std::string backend;            // the queue's description()
  double seconds = 0;
};

absl::StatusOr<RangeReadStats> ReadRangesF32(const PretrainedCheckpoint& checkpoint,
                                             absl::Span<const RangeToRead> ranges, const RangeReadOptions& options,
                                             const RangeSink& sink);

// Writes `tensors` (F32, as WriteSafetensors: each tensor's values fetched when reached, one in memory at a time)
// in Hugging Face's layout into directory `dir` (created if missing): one model.safetensors when their bytes fit
// in `max_shard_bytes`, else files model-0000k-of-0000n.safetensors of at most `max_shard_bytes` of tensor data
// each (a larger tensor alone in its file), in order, and model.safetensors.index.json ({"metadata":
// {"total_size": bytes, ...metadata}, "weight_map": {name: file}}) written last. Every file goes to a temporary
// name, is fsynced and renamed. Then the files of an earlier export in `dir` that this one did not write
// (model.safetensors, model-*-of-*.safetensors, the index) are removed, so that no reader takes a stale file for
// the new one. Returns the files written, in order.
absl::StatusOr<std::vector<std::string>> WriteSafetensorsDir(const std::string& dir,
                                                             const std::vector<TensorToWrite>& tensors,
                                                             uint64_t max_shard_bytes,
                                                             const std::map<std::string, std::string>& metadata);

}  // namespace strata::checkpoint
