// Resharding: reading saved state into a layout of another world size or stage. Checkpoint state is
// addressed by global element offset inside a unit's flat buffer (shard_file.h), so moving it between
// layouts is interval arithmetic over saved ranges: which ranges a rank writes, which saved shards
// overlap the wanted elements, and which part of each range lands where. That arithmetic lives here
// once; the engine's save (engine_checkpoint.cc: each rank's slice), restore (engine_restore.cc: each
// rank's update range) and export (consolidate.cc: whole parameters) use it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/shard_file.h"

namespace strata::checkpoint {

// One range a rank saves and which of the kinds passed to RangesToSave it holds.
struct SaveRange {
  ShardRange range;  // unit, param, kind, begin, count; the file offset and crc are the writer's
  size_t kind = 0;   // index into the kinds
};

// The ranges a rank holding elements [lo, hi) of `unit` writes: for each kind in the order given, each
// parameter's overlap with [lo, hi), in parameter order; parameters outside [lo, hi) write nothing.
// This order is the shard file's (shard_file.h), so a checkpoint's bytes depend on it.
std::vector<SaveRange> RangesToSave(const ManifestUnit& unit, uint64_t lo, uint64_t hi,
                                    absl::Span<const std::string> kinds);

// Copies the elements of the global range [lo, hi) that `range` holds from `values` (its range.count
// values, element range.begin first) to dst, where dst[0] is element lo. Elements of `range` outside
// [lo, hi) are not copied. Returns how many were.
uint64_t CopyOverlap(const ShardRange& range, absl::Span<const float> values, uint64_t lo, uint64_t hi, float* dst);

// The shard files of one checkpoint, each opened on first use and verified against the manifest
// (OpenShard), so a restore opens only the shards its range overlaps.
class ShardReaders {
 public:
  ShardReaders(const Manifest& man, std::string step_dir) : man_(man), dir_(std::move(step_dir)) {}
  absl::StatusOr<const ShardReader*> Get(int rank);

 private:
  const Manifest& man_;
  std::string dir_;
  std::map<int, ShardReader> open_;
};

// Fills dst[0, hi - lo) with the saved `kind` values of elements [lo, hi) of parameter `param` of unit
// `unit`, where the saved layout gave rank s the elements [s * saved_slice, (s + 1) * saved_slice) of
// the unit. Reads only the shards whose slices overlap [lo, hi); each must hold the whole of its part
// (else DataLoss naming the rank, the elements and what it holds). saved_slice 0 is DataLoss.
absl::Status ReadResharded(ShardReaders& shards, const std::string& unit, const std::string& param,
                           const std::string& kind, uint64_t lo, uint64_t hi, uint64_t saved_slice, float* dst);

}  // namespace strata::checkpoint
