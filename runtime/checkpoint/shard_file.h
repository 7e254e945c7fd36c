// One rank's shard of a checkpoint: fp32 ranges of master weights and optimizer state, each addressed by
// (unit, parameter, kind) and by its global element offset inside the unit's flat buffer, which does not
// depend on the world size. That addressing is what lets any world size load any checkpoint.
//
// Layout: "STRATASH", u64 header length, a JSON header (rank, world size, and per range: unit, param,
// kind, begin, count, byte offset, CRC-32 of its bytes), padding to 4096, then the data: the ranges one after
// the other, except the lanes of NVMe state, laid out as their tiles (Note [NVMe lanes laid out as tiles]). The header
// is written last (the CRCs are known only then), the file goes to a temporary name, is fsynced and renamed. The file
// checksum recorded in the manifest is the CRC-32 of the header, which holds every range's CRC, so it covers the whole
// file.
//
// A shard file comes from outside like the manifest: Open reads it only inside its step directory
// (Note [Confined names] in files.h), bounds the header's length and nesting, and checks every range's
// fields, that ranges do not repeat, and that each lies in the file's data area, with checked
// arithmetic, before a byte of data is read. A writer that fails leaves no temporary behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/checkpoint/files.h"

namespace strata::checkpoint {

struct ShardRange {
  std::string unit;
  std::string param;
  std::string kind;     // optim::StateKindName: "master", "exp_avg", "exp_avg_sq" (Adam) or "momentum" (SGD)
  uint64_t begin = 0;   // global element offset inside the unit's flat buffer
  uint64_t count = 0;   // fp32 elements
  uint64_t offset = 0;  // byte offset of the data in the file
  uint32_t crc = 0;
};

// Note [NVMe lanes laid out as tiles]. (docs/decisions/0057-cloned-checkpoint-lanes.md) The ranges of one kind of
// one unit whose state lives on NVMe (a lane: Note [NVMe state] in optim/nvme_state.h) lie in the file as in the
// lane: the lane starts on a whole block (4096 bytes), each range at the lane's start plus 4 * (its begin - the
// lane's begin); the bytes between ranges (the update range's padding) are the lane's, zeros fill the gap before
// the lane and its last block. So each tile's whole blocks are where a clone of them puts them (Note [Cloned
// checkpoint lanes] in files.h), and every reader takes the ranges by their offsets in the header, unchanged.
// Which lanes are laid out so depends only on where the state lives (offload_optimizer = nvme), never on the file
// system, so the synchronous save and the asynchronous one, cloned or streamed, write the same bytes.
struct ShardLane {
  size_t first = 0, end = 0;  // its ranges [first, end) of the writer's, ascending in begin, not overlapping
  uint64_t begin = 0;         // the global element offset of the lane's first element
  uint64_t elems = 0;         // fp32 elements; every range lies in [begin, begin + elems)
};

inline constexpr uint64_t kMaxShardHeaderBytes = uint64_t{256} << 20;

struct ShardHeader {
  int rank = 0, world_size = 1;
  std::vector<ShardRange> ranges;
};
// Parses and validates the JSON header of a shard file of `file_size` bytes (`path` names it in errors):
// nesting, field types, known kinds, no repeated range, each range's data inside the file after the
// header, with checked arithmetic. Pure and never aborts, whatever the input (the fuzzers call it).
absl::StatusOr<ShardHeader> ParseShardHeader(absl::string_view header, uint64_t file_size, absl::string_view path);

class ShardWriter {
 public:
  // `ranges` give unit, param, kind, begin and count; offsets are assigned here. `lanes` (ascending, not
  // overlapping) are laid out as tiles (Note [NVMe lanes laid out as tiles]); their ranges are written only
  // through WriteLane and CloneTile.
  static absl::StatusOr<ShardWriter> Create(const std::string& path, int rank, int world_size,
                                            std::vector<ShardRange> ranges, std::vector<ShardLane> lanes = {});
  // Writes range `index` (count floats). Any order; each exactly once.
  absl::Status Write(size_t index, const float* data);
  // Writes the next `n` floats of range `index`, after those written before (its CRC is the whole range's):
  // a range streamed in pieces, in order, its bytes those of one Write. Ranges in any order.
  absl::Status WritePart(size_t index, const float* data, uint64_t n);
  // Writes the next n floats of lane `lane` (its ranges and the padding between them), in order: lanes in any
  // order, each lane's elements front to back, each exactly once. Its last write also writes its last block's zeros.
  absl::Status WriteLane(size_t lane, const float* data, uint64_t n);
  // Note [Cloned checkpoint lanes] (files.h): the lane's next `bytes` bytes, one tile of NVMe state (starting on a
  // whole block; whole blocks but for the lane's last tile), cloned from `sources` (the tile's placement, in order,
  // whole blocks of open files), and its last partial block read from them. `crc` is the CRC-32 of the tile's bytes
  // as its store recorded them: the ranges' CRCs are spliced from it (crc32.h's Crc32Middle) and from the pieces of
  // the tile read back, all but its largest piece of one range (or of the padding between ranges). The cloned bytes
  // themselves are not checked against `crc`: ClonedCrc reads them back for that, where nobody else checked them.
  // Unimplemented where the file systems cannot clone: nothing changed, and the caller writes the tile with
  // WriteLane.
  struct CloneSource {
    int fd = -1;
    std::string path;  // as errors name it
    uint64_t offset = 0, bytes = 0;
  };
  struct ClonedTile {
    uint64_t at = 0, bytes = 0;  // where it lies in the file, and its bytes
    std::string tail;            // its last partial block's bytes (the lane's last tile)
  };
  absl::StatusOr<ClonedTile> CloneTile(size_t lane, const std::vector<CloneSource>& sources, uint64_t bytes,
                                       uint32_t crc);
  // The CRC-32 of a cloned tile's bytes as the file holds them, read back.
  absl::StatusOr<uint32_t> ClonedCrc(const ClonedTile& tile);
  // Bytes read back from the file so far, for CRCs (CloneTile's pieces and ClonedCrc).
  uint64_t read_back_bytes() const { return read_back_; }
  // The lane range `range` lies in (Create's `lanes`), or -1.
  int lane_of(size_t range) const { return lane_of_[range]; }
  // The elements of lane `lane` written so far (WriteLane and CloneTile).
  uint64_t lane_done(size_t lane) const { return lane_done_[lane]; }
  // Whether the data still goes to the file with O_DIRECT (Note [Direct checkpoint writes]; tests).
  bool direct() const { return file_.direct(); }
  // Writes the header, fsyncs, renames into place. Returns {file checksum, file size}.
  absl::StatusOr<std::pair<uint32_t, uint64_t>> Finish();

 private:
  struct Free {
    void operator()(char* p) const;
  };
  absl::Status StartLane(size_t lane);                       // the zeros before it, on its first write
  void Account(size_t lane, const float* data, uint64_t n);  // the next n floats' CRCs
  // Lane elements [from, to) (from: the lane's next) as pieces in order: each range's part, and the padding between.
  struct Piece {
    uint64_t b, e;
    int range;  // or -1: padding
    uint32_t crc = 0;
  };
  std::vector<Piece> PiecesOf(size_t lane, uint64_t from, uint64_t to) const;
  // Piece `p`'s range now holds its elements, `crc` being the CRC-32 of all of them so far.
  void Advance(size_t lane, const Piece& p, uint32_t crc);
  // Bytes [from, to) of a cloned tile, in order, to visit(offset in the tile, data, n): its whole blocks read back from
  // the file, its tail from memory.
  template <typename Visit>  // visit(uint64_t offset, const char* data, uint64_t n); shard_file.cc alone calls it
  absl::Status VisitTile(const ClonedTile& tile, uint64_t from, uint64_t to, Visit&& visit);
  std::string path_;
  TempFile tmp_;  // unlinked unless Finish() renamed it into place
  int rank_ = 0, world_ = 1;
  StreamFile file_;  // Note [Direct checkpoint writes]: the ranges in file order are one stream
  std::vector<ShardRange> ranges_;
  std::vector<bool> written_;
  std::vector<uint64_t> part_;  // per range: the floats WritePart wrote so far
  std::vector<int> lane_of_;    // per range: its lane, or -1
  std::vector<ShardLane> lanes_;
  std::vector<uint64_t> lane_at_, lane_pad_from_;  // per lane: its file offset, and where the zeros before it begin
  std::vector<uint64_t> lane_done_;                // per lane: elements written
  std::vector<bool> lane_started_;                 // per lane: the zeros before it written
  std::vector<size_t> lane_next_;                  // per lane: its first range not yet written whole
  Fd readback_;                                    // the temporary, read back for a clone's CRCs
  std::unique_ptr<char, Free> readback_buffer_;
  uint64_t read_back_ = 0;
  uint64_t header_bytes_ = 0, end_ = 0;
};

class ShardReader {
 public:
  // Opens `file` inside `dir` (never outside it) and parses the header. When `expected_checksum` /
  // `expected_size` are given (from the manifest), a mismatch is DataLoss naming the file.
  static absl::StatusOr<ShardReader> Open(const std::string& dir, const std::string& file,
                                          const uint32_t* expected_checksum = nullptr,
                                          const uint64_t* expected_size = nullptr);
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  const ShardRange* Find(const std::string& unit, const std::string& param, const std::string& kind) const;
  // Reads a whole range and verifies its CRC (DataLoss naming the file and the range on mismatch).
  absl::Status Read(const ShardRange& r, std::vector<float>* out) const;
  int rank() const { return rank_; }
  int world_size() const { return world_; }

 private:
  std::string path_;
  Fd fd_;
  int rank_ = 0, world_ = 1;
  std::vector<ShardRange> ranges_;
};

}  // namespace strata::checkpoint
