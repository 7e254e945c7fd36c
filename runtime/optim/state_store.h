// StateStore: one run's optimizer state (the fp32 master and every StateKind of every unit) wherever it
// lives, and the update of one unit over it (issue 16: optim/ owns the state and the step). Two
// implementations, picked once at Finalize from the placement: MemoryState (memory_state.h: device or
// pinned-host buffers, through the tiers' own operations, Note [Tier ops]) and NvmeState
// (nvme_state.h: tiles on NVMe). Units are numbered as the engine registered them; each kind covers the
// unit's update range (the rank's slice at stages 1-3, the whole unit at stage 0).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "runtime/offload/tiled_pipeline.h"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/hyper.h"
#include "runtime/optim/state_kind.h"
#include "runtime/shard/layout.h"
#include "runtime/shard/param_storage.h"

namespace strata::optim {

// Where one unit's update writes the updated parameters: the update range of the param storage, in the
// param dtype. The store picks the access it can use.
struct ParamsAccess {
  // The range in host memory through the rank's parameter storage (shard/param_storage.h: in place where
  // the CPU reaches it, else a host copy written back); the update overwrites the whole range.
  shard::ParamStorage* storage = nullptr;
  shard::ParamRange range;
  // The range on the param storage's own tier, for state the CPU cannot reach (device state updates
  // device params in place).
  char* in_place = nullptr;
};

// Runs write(params) with the update range of `p` in host memory (p.storage), then writes it back; an
// empty range runs nothing. Called down, not back (docs/design.md "Calls only descend").
template <typename F>
absl::Status WriteParamsOnHost(const ParamsAccess& p, F&& write) {
  STRATA_ASSIGN_OR_RETURN(char* params, p.storage->Open(p.range, /*keep=*/false));
  if (params == nullptr) return absl::OkStatus();
  const absl::Status s = write(params);
  STRATA_RETURN_IF_ERROR(p.storage->Close(s.ok()));
  return s;
}

// One unit's step: its gradients over the update range (fp32, already scaled), the parameter runs of
// the range, where the params go and the step's scalars.
struct UnitStep {
  const float* grad = nullptr;
  const std::vector<shard::Segment>* segments = nullptr;  // relative to the update range's start
  ParamsAccess params;
  DType param_dtype = DType::kF32;
  absl::Span<const GroupHyper> groups;  // each param group's lr and decay (Note [Param groups]), by Segment::group
  int64_t step = 0;  // 1-based, as ApplyUpdate takes it
  float clip_coef = 1;
  HostExecutor* executor = nullptr;  // host updates that take one explicitly (NVMe tiles); same bits for any
};

// One kind of one unit as it was when the snapshot was taken (StateStore::Snapshot), read later, front to
// back, possibly on another thread than the training's, without a copy of it in host memory (Note
// [Snapshots of NVMe state] in nvme_state.h; a frozen unit's params, read in place: Note [Frozen units in a
// snapshot] in engine/unit_storage.cc). Destroying it lets go of what it still holds.
// Where a snapshot's fp32 tiles lie in files, for a checkpoint writer that clones them instead of reading them
// (Note [Cloned checkpoint lanes] in checkpoint/files.h): tile t holds elements [t * tile_elems, ...) in the pieces
// tiles[t], one after the other (stripes), each whole blocks of its file. A tile already let go has none.
struct LanePiece {
  std::string name;       // as errors name the file
  std::string open_path;  // where this process opens it
  uint64_t offset = 0, bytes = 0;
};
struct LaneFiles {
  uint64_t tile_elems = 0;
  std::vector<std::vector<LanePiece>> tiles;
  std::vector<std::optional<uint32_t>> crcs;  // per tile: the CRC-32 of its elements' bytes, where the store has one
  uint64_t store_free_bytes = 0;  // the store's room when the snapshot was taken: for the steps' writes apart from it
};

class KindSnapshot {
 public:
  virtual ~KindSnapshot() = default;
  virtual size_t elems() const = 0;
  // Copies elements [at, at + n) to dst. Calls ascend (`at` never goes back): what lies wholly before `at`
  // is let go first.
  virtual absl::Status Read(size_t at, size_t n, float* dst) = 0;
  // Lets go of everything (the staging buffer too); nothing may be read afterwards.
  virtual void Release() = 0;
  // The files its elements lie in as fp32 tiles, or nullopt (memory, another dtype). Valid while it holds them.
  virtual std::optional<LaneFiles> Files() const { return std::nullopt; }
  // Lets go of what lies wholly before element `at`, as Read would (a writer that cloned it); reads go on from `at`.
  virtual void Skip(size_t /*at*/) {}
  // Note [Cloned checkpoint lanes]: of tile t of Files(), whether a read since its last write found its bytes
  // matching its checksum (the live update's read: `checked`), and whether the live state needs it let go now
  // (it writes the tile elsewhere without having read it, or waits for room): then nobody will check it.
  struct TileCheck {
    bool checked = false;
    bool let_go_now = true;
  };
  virtual TileCheck Check(size_t /*tile*/) const { return {}; }
  // Bytes of the state it holds outside host memory, and the host bytes it stages through at most.
  virtual uint64_t held_bytes() const = 0;
  virtual uint64_t staging_bytes() const = 0;
  // Bytes of host memory it reads in place, held without a copy (a frozen unit's params), until released.
  virtual uint64_t in_place_bytes() const { return 0; }
};

// A snapshot of `elems` values of `dtype` held in place in host memory and read as floats (a frozen unit's
// params: Note [Frozen units in a snapshot] in engine/unit_storage.cc). The caller leaves them unchanged until
// the snapshot is released or destroyed.
std::unique_ptr<KindSnapshot> InPlaceSnapshot(const char* data, size_t elems, DType dtype);
// `n` values of `dtype` at `data` as floats into `dst` (exact: bf16 and fp16 widen). The one conversion of a
// frozen unit's params, for a copy (engine's FrozenState::Read) and for InPlaceSnapshot alike.
void ReadAsFloats(const char* data, DType dtype, size_t n, float* dst);

class StateStore {
 public:
  virtual ~StateStore() = default;
  // One kind of a unit over its update range, as a host vector (export, SetParam, checkpoints,
  // initialisation; never on the step's hot path).
  virtual absl::StatusOr<std::vector<float>> Read(int unit, StateKind kind) = 0;
  virtual absl::Status Write(int unit, StateKind kind, const std::vector<float>& values) = 0;
  // The kind over the update range in place, lent to the caller where the CPU reaches the store's memory, to
  // read or change there until its next call on the store; nullopt where it does not (device memory, NVMe
  // tiles), and the caller stages it through Read and Write. An edit of the state is the caller's, calling down
  // (docs/design.md "Calls only descend"). The default lends nothing.
  virtual std::optional<absl::Span<float>> Lend(int unit, StateKind kind);
  // A snapshot of the kind that costs no copy (NVMe tiles), or null where the store has none (state in
  // memory: the caller copies it). Between steps only; the live state stays usable meanwhile.
  virtual std::unique_ptr<KindSnapshot> Snapshot(int /*unit*/, StateKind /*kind*/) { return nullptr; }
  // The optimizer step of one unit (cfg.type's kinds); the params receive the updated master rounded to
  // the param dtype (or copied, fp32, when the master is kept apart). Returns the NVMe pipeline's
  // counters (zero for state in memory).
  virtual absl::StatusOr<offload::TilePipelineStats> Step(int unit, const OptimizerConfig& cfg,
                                                          const UnitStep& up) = 0;
};

}  // namespace strata::optim
