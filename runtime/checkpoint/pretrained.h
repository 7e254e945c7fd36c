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
// Then a RangeReader reads only the element ranges it is asked for (a rank's held part of each parameter),
// through an offload::IoQueue: io_uring with its staging buffers registered (READ_FIXED), or the queue's
// pread thread pool where io_uring is not built or refused (io_queue.h). The ranges are cut into read requests
// of at most 1 MiB, packed into one batch per staging buffer, several buffers in flight (by default 4 x 8 MiB:
// 32 requests of 1 MiB, the depth and block of the fio reference in docs/perf-notes.md); each completed buffer is
// converted to fp32 (F32, BF16, F16; any other dtype is refused before any I/O, naming the tensor) and handed
// back piece by piece to the caller, which asks for each (RangeReader::Next), in order of the ranges. The bytes
// it reads are exactly the ranges' bytes (the queue's stats count them: RangeReadStats::bytes_read), so a rank
// reads nothing of the parts other ranks keep. A file shortened after it was opened is DataLoss naming it (the
// queue's end-of-file rule).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/offload/io_queue.h"

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

// OK when tensor `tensor` (an index into tensors()) is F32, BF16 or F16, which RangeReader converts; else
// InvalidArgument naming the file, the tensor and its dtype.
absl::Status CheckReadableAsF32(const PretrainedCheckpoint& checkpoint, size_t tensor);

// Elements [first, first + count) of tensor `tensor` (an index into tensors()); `tag` is the caller's.
struct RangeToRead {
  size_t tensor = 0;
  uint64_t first = 0;
  uint64_t count = 0;
  int64_t tag = 0;
};

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
  uint64_t elements = 0;          // elements handed back (RangeReader::Next)
  bool registered = false;        // the staging buffers were registered with the queue
  std::string backend;            // the queue's description()
  double seconds = 0;
};

// Reads `ranges` (see the Note) and hands the values back piece by piece, in order of the ranges; the caller
// drives it and the reader only returns data (docs/design.md "Calls only descend"):
//
//   STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RangeReader> r, RangeReader::Open(checkpoint, ranges, options));
//   while (true) {
//     STRATA_ASSIGN_OR_RETURN(const bool more, r->Next());
//     if (!more) break;
//     use(r->range(), r->first(), r->values());  // elements [first, first + values.size()) of range's tensor
//   }
//   STRATA_ASSIGN_OR_RETURN(RangeReadStats stats, r->Finish());
//
// A staging buffer is read into again only once the caller asked for the piece after its last one, so the
// values handed out stay valid until the next call of Next. A reader dropped early (the caller's error) reads
// no further and waits for the reads in flight.
class RangeReader {
 public:
  // Checks the ranges (tensor, dtype, bounds) before any I/O, then starts the first reads.
  static absl::StatusOr<std::unique_ptr<RangeReader>> Open(const PretrainedCheckpoint& checkpoint,
                                                           absl::Span<const RangeToRead> ranges,
                                                           const RangeReadOptions& options);
  ~RangeReader();
  RangeReader(const RangeReader&) = delete;
  RangeReader& operator=(const RangeReader&) = delete;

  // The next piece: true with range(), first() and values() set to it; false after the last; the error of a
  // read (then nothing more is read).
  absl::StatusOr<bool> Next();
  const RangeToRead& range() const { return ranges_[piece().range]; }
  uint64_t first() const { return piece().first; }
  absl::Span<const float> values() const { return values_; }
  // After Next returned false: the queue's counters and the time since Open.
  absl::StatusOr<RangeReadStats> Finish();

  // A piece of a range, at an 8-aligned byte offset of one staging buffer.
  struct Piece {
    size_t range = 0;
    uint64_t first = 0;  // element
    uint64_t count = 0;
    uint64_t at = 0;  // byte offset in the buffer
  };
  // One staging buffer's worth of reads.
  struct Batch {
    std::vector<Piece> pieces;
    uint64_t bytes = 0;
  };

 private:
  RangeReader(const PretrainedCheckpoint& checkpoint, absl::Span<const RangeToRead> ranges);
  const Piece& piece() const;
  void Submit(size_t batch);  // starts the reads of a batch into its staging buffer
  void Hand();                // converts the current piece into values_

  const PretrainedCheckpoint& checkpoint_;
  std::vector<RangeToRead> ranges_;
  std::vector<Batch> batches_;
  std::chrono::steady_clock::time_point start_;
  uint64_t buffer_bytes_ = 0;
  size_t buffer_count_ = 0;
  // The staging region outlives the queue, whose destructor waits for every request still in flight.
  std::unique_ptr<char, void (*)(void*)> region_{nullptr, nullptr};
  std::unique_ptr<offload::IoQueue> queue_;
  std::deque<offload::IoWork> in_flight_;
  size_t next_ = 0;        // the next batch to submit
  size_t batch_ = 0;       // the batch being handed out (or waited for)
  size_t piece_ = 0;       // its piece handed out last
  bool in_batch_ = false;  // batch_ has been read and is being handed out
  absl::Status failed_;    // a read's error: Next returns it again
  std::vector<float> values_;
  RangeReadStats stats_;
};

// Writes `tensors` (F32, streamed as SafetensorsWriter writes them: the caller hands over each tensor's values
// in turn, one in memory at a time) in Hugging Face's layout into directory `dir` (created if missing): one
// model.safetensors when their bytes fit in `max_shard_bytes`, else files model-0000k-of-0000n.safetensors of
// at most `max_shard_bytes` of tensor data each (a larger tensor alone in its file), in order, and
// model.safetensors.index.json ({"metadata": {"total_size": bytes, ...metadata}, "weight_map": {name: file}})
// written last. Every file goes to a temporary name, is fsynced and renamed. Then the files of an earlier export
// in `dir` that this one did not write (model.safetensors, model-*-of-*.safetensors, the index) are removed, so
// that no reader takes a stale file for the new one.
class SafetensorsDirWriter {
 public:
  // Plans the files from the shapes alone and opens the first one.
  static absl::StatusOr<SafetensorsDirWriter> Begin(const std::string& dir, std::vector<TensorToWrite> tensors,
                                                    uint64_t max_shard_bytes,
                                                    const std::map<std::string, std::string>& metadata);
  // The tensor the next WriteTensor writes; nullptr once every tensor is written.
  const TensorToWrite* next() const { return next_ < tensors_.size() ? &tensors_[next_] : nullptr; }
  // The next tensor's values: exactly its numel() of them. A file is renamed into place after its last tensor.
  absl::Status WriteTensor(absl::Span<const float> values);
  // After the last tensor: the index (several files), then the stale files' removal. Returns the files
  // written, in order.
  absl::StatusOr<std::vector<std::string>> Finish();

 private:
  SafetensorsDirWriter() = default;
  absl::Status OpenFile();  // the writer of file file_

  std::string dir_;
  std::vector<TensorToWrite> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::vector<size_t>> files_;  // the tensors of each file
  std::vector<std::string> names_;          // the files' names
  uint64_t total_ = 0;                      // tensor bytes in all
  size_t file_ = 0, next_ = 0;              // the file being written, the next tensor
  std::optional<SafetensorsWriter> writer_;
};

}  // namespace strata::checkpoint
