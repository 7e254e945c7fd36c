// Publishing a sharded checkpoint (docs/design.md "Checkpoints"): after every rank wrote its shard file,
// the collective that makes the step directory complete. Shared by the synchronous save
// (Engine::SaveCheckpoint) and the asynchronous one (async_save.h), so both commit alike.
//
// Protocol (every rank): all-gather (checksum, size, ok) so rank 0 knows every shard is durable; rank 0
// checks that it sees each shard (Note [Visible shards]) and writes the manifest (temporary name, fsync,
// rename); an all-reduce of rank 0's result makes every rank return the same verdict. A rank that failed
// still takes part in both collectives, so nobody waits on it; the manifest is written only when every
// shard succeeded, so a failed or interrupted save never publishes a partial checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/comm/communicator.h"

namespace strata::checkpoint {

// "shard_00003.bin": the file of shard rank 3.
std::string ShardName(int rank);

// What one rank wrote, as raw bytes for the all-gather.
struct ShardReport {
  uint32_t checksum = 0;
  uint32_t ok = 0;
  uint64_t bytes = 0;
  int32_t shard = -1;  // the shard rank whose file this rank wrote, or -1 (a replica that writes nothing)
  uint32_t unused = 0;
};

// What every rank wrote, as the first phase of publishing gathered it.
struct ShardReports {
  std::vector<ShardReport> all;  // by rank of `control`
  std::vector<int> failed;       // the ranks that could not write their shard
  // Rank 0 when every rank succeeded: the caller builds the manifest and hands it to PublishCheckpoint.
  bool needs_manifest = false;
};

// Publishing in two phases, the caller between them (docs/design.md "Calls only descend": the manifest is
// the caller's, built by it, not called back). Every rank of `control`, after writing its shard into
// `step_dir`: `mine` is what it wrote and `local` its outcome (OK, or why it wrote nothing, logged here).
// GatherShardReports all-gathers the reports; where `needs_manifest`, the caller then builds the manifest
// without its shards, and PublishCheckpoint (every rank) fills them from the reports, writes it, and returns
// the agreed verdict, the same on every rank, naming `step_dir` when nothing was published. `manifest` is read
// only where `needs_manifest` (elsewhere a default Manifest).
absl::StatusOr<ShardReports> GatherShardReports(comm::Communicator& control, device::Stream& stream, ShardReport mine,
                                                const absl::Status& local);
absl::Status PublishCheckpoint(comm::Communicator& control, device::Stream& stream, const std::string& step_dir,
                               const ShardReports& reports, const absl::Status& local, Manifest manifest);

}  // namespace strata::checkpoint
