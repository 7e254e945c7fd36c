// Note [Asynchronous checkpoints]. (docs/decisions/0036-async-checkpoints.md) A save that returns once this
// rank's shard of the state is copied into host memory (the snapshot), except the state on NVMe, whose tiles
// the snapshot holds without a copy (Note [Snapshots of NVMe state] in optim/nvme_state.h, decision 0046);
// a thread then writes the shard file, fsyncs and renames it, and takes part in the publication
// (publish.h), manifest last, exactly as the synchronous save does: the same files, byte for byte, and the
// same crash consistency, since a step directory is complete only once its manifest is renamed into place.
//
// The thread runs its collectives on a communicator of its own (a Dup of the engine's control
// communicator, made once, collectively, by the first asynchronous save), so they never interleave with
// the training's. It never touches the engine: the snapshot and the manifest are copies, or objects of the
// state store below it (optim::KindSnapshot) that it reads.
//
// One save in flight: a second save first waits for the one in flight. Its outcome is agreed by every
// rank (PublishCheckpoint). A failure is returned, naming the step directory, by the first of: the next
// Step() that finds the save finished (Failure()), the next save (which then does not start), Wait(). A
// success is silent. Destroying the saver waits for the save in flight and logs a failure nobody took.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/shard_file.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/optim/state_store.h"

namespace strata::checkpoint {

// One rank's shard, as it was when the save began: the ranges of its file (ShardWriter::Create's argument)
// and, for each, where its floats are: in `buffers` (copied into host memory), or, where lanes[buffer] is
// set, in a snapshot that holds them without a copy (its buffer is then empty), read front to back: NVMe
// state through its own staging tile (Note [Snapshots of NVMe state] in optim/nvme_state.h), a frozen unit's
// params in place (Note [Frozen units in a snapshot] in engine/unit_storage.cc).
struct ShardSnapshot {
  std::vector<ShardRange> ranges;
  std::vector<std::vector<float>> buffers;
  std::vector<std::unique_ptr<optim::KindSnapshot>> lanes;  // per buffer: null, or where its floats are
  std::vector<std::pair<size_t, uint64_t>> at;              // per range: (buffer, element offset)
  std::vector<ShardLane> tiled;     // the lanes laid out as tiles (ShardWriter::Create's), each read from 0 on
  uint64_t bytes() const;           // the floats held in host memory
  uint64_t nvme_bytes() const;      // the NVMe bytes the lanes hold
  uint64_t in_place_bytes() const;  // the host bytes the lanes hold in place
  uint64_t staging_bytes() const;   // the most host bytes a lane stages through
};

// What the last snapshot held (Engine::checkpoint_snapshot_bytes).
struct SnapshotBytes {
  uint64_t host = 0;      // floats copied into host memory
  uint64_t nvme = 0;      // NVMe state and frozen parameter shards held without a copy
  uint64_t staging = 0;   // host memory the writer reads those through, one lane at a time
  uint64_t in_place = 0;  // host memory held without a copy (frozen units' params), in their dtype
};

// What a save's clones of NVMe tiles came to on this rank (Note [Cloned checkpoint lanes] in files.h): the tiles
// cloned, those of them the steps' reads checked, and the bytes read back from the shard file (for the ranges'
// CRCs, and the tiles nobody else checked).
struct CloneCounts {
  uint64_t tiles = 0, checked_by_steps = 0, read_back_bytes = 0;
};
// How long a writer holds cloned tiles for the steps to check them at most, before it reads the rest back itself
// (decision 0058). The saver's communicator waits twice this longer than the training's for the writers' reports.
inline constexpr int64_t kCloneHoldMs = 120000;

// Everything a save needs after the snapshot, on every rank.
struct AsyncSaveJob {
  std::string step_dir;
  absl::Status local;  // this rank's preparation (checks, directory, snapshot): a failure is still published
  int shard = -1;      // the shard rank whose file this rank writes, or -1 (a replica: nothing)
  int shard_world = 1;
  ShardSnapshot snapshot;
  Manifest manifest;  // rank 0: the manifest without its shards
};

// The room clones of NVMe tiles take once the steps rewrite them (Note [Cloned checkpoint lanes]): the free bytes of
// the shard's file system, and what the shards of every rank that writes there take, their clones included.
// Default: this rank's own clones alone (WriteSnapshot then reads the free bytes itself).
struct CloneRoom {
  std::optional<uint64_t> free;
  std::optional<uint64_t> need;
  int ranks = 1;  // the ranks whose clones `need` counts
};

// Writes the shard of `snapshot` to `path` (ShardWriter: temporary, fsync, rename). {checksum, bytes}. Lets
// go of each lane once written (of every lane, whatever the outcome). Cloned tiles are held until the live state's
// reads check them, or read back at once while `hurry` is set or null (Note [Cloned checkpoint lanes]). Clones
// only where `room` has the room.
absl::StatusOr<std::pair<uint32_t, uint64_t>> WriteSnapshot(const std::string& path, int shard, int shard_world,
                                                            ShardSnapshot& snapshot,
                                                            const std::atomic<bool>* hurry = nullptr,
                                                            CloneCounts* counts = nullptr, const CloneRoom& room = {});

// The bytes of the snapshot's lanes laid out as tiles (Note [NVMe lanes laid out as tiles]): what their clones take
// once the steps rewrite them.
uint64_t TiledBytes(const ShardSnapshot& snapshot);

// The bytes of the snapshot's other ranges: written as the save streams them.
uint64_t StreamedBytes(const ShardSnapshot& snapshot);

// Collective over `control`: CloneRoom for a shard under `dir` whose tiled lanes are `clones` bytes and whose other
// ranges `streamed` (0 and 0 for a rank that writes none), counting every rank whose shard directory is on the same
// file system of the same machine (its boot id: containers on one host share it).
absl::StatusOr<CloneRoom> SharedCloneRoom(comm::Communicator& control, device::Stream& stream, const std::string& dir,
                                          uint64_t clones, uint64_t streamed);

// Tests only: `hook` runs on every writer thread before it writes its shard (empty: none), so a test can
// hold the write until training changed the state. Set it while no save is in flight.
void SetBeforeAsyncWriteForTest(std::function<void()> hook);

// The failure Failure() returns (the step it was returned from was not taken, and may be called again).
bool IsAsyncSaveFailure(const absl::Status& s);

class AsyncSaver {
 public:
  // `control`: the saver's own communicator over every rank (its collectives run on the writer thread).
  explicit AsyncSaver(std::unique_ptr<comm::Communicator> control);
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Waits for the save in flight, if any (its unreported failure is returned and `job` is not started),
  // then starts `job` on a new thread.
  absl::Status Start(AsyncSaveJob job);
  // Waits for the save in flight and returns the last save's outcome (OK when there was none); a failure
  // counts as reported.
  absl::Status Wait();
  // Waits for the save in flight to end; its outcome is left to be reported as always (by the next Step(),
  // save, Wait or Drain). For a write to what a snapshot holds in place (Note [Frozen units in a snapshot]).
  void Settle();
  // Waits for the save in flight; its failure when not yet reported (then reported), else OK. With `next`
  // (the save about to begin), the failure says that save was not started.
  absl::Status Drain(const std::string& next = "");
  // Never blocks: the failure of a finished save not yet reported (then reported, marked for
  // IsAsyncSaveFailure), else OK.
  absl::Status Failure();
  bool in_flight() const;
  // The snapshot buffers of the last finished save (kept for the next snapshot to reuse; empty while a
  // save is in flight), handed over once.
  std::vector<std::vector<float>> TakeSpareBuffers();
  // What the snapshot of the last save held when it started.
  SnapshotBytes last_snapshot() const;
  // What the last finished save's clones came to on this rank (zeros before the first).
  CloneCounts last_clones() const;

 private:
  void Run(AsyncSaveJob job);
  void Join();

  std::unique_ptr<comm::Communicator> control_;
  std::unique_ptr<device::Stream> stream_;
  std::thread thread_;
  std::atomic<bool> hurry_{false};  // set while the training waits for the save (Join)
  mutable std::mutex mu_;
  bool running_ = false;  // guarded by mu_
  bool reported_ = true;  // guarded by mu_: the outcome was returned (or there is none)
  absl::Status outcome_;  // guarded by mu_
  std::vector<std::vector<float>> spare_;  // guarded by mu_
  CloneCounts clones_;                     // guarded by mu_
  SnapshotBytes last_;                     // guarded by mu_
};

}  // namespace strata::checkpoint
