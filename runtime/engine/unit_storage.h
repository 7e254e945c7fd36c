// The units' storage beside their own buffers (UnitStorage): where each kind of buffer lives over the
// runtime's tiers, the NVMe parameter cache and the host access to a range of the parameter storage, and the
// fp32 master and optimizer state with each unit's access to it (StateOwner). Not a public header: the
// engine's own files include it through engine_impl.h. Implemented in unit_storage.cc.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/engine/config.h"
#include "runtime/engine/engine_runtime.h"
#include "runtime/engine/placement.h"
#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/offload/nvme_store.h"
#include "runtime/offload/pinned_pool.h"
#include "runtime/offload/shard_cache.h"
#include "runtime/optim/memory_state.h"
#include "runtime/optim/state_kind.h"
#include "runtime/optim/state_store.h"
#include "runtime/optim/step.h"
#include "runtime/optim/tier_update.h"
#include "runtime/shard/layout.h"
#include "runtime/shard/param_storage.h"

namespace strata::engine {

struct UnitState;

// The rank's parameter storage beside the units' own buffers: with offload_param = nvme the shards in an
// NVMe store behind a cache of pinned buffers (Note [NVMe params]; all null otherwise), and the host
// access to a range of it (shard/param_storage.h), which OpenParams and the step's updates open.
struct ParamStore {
  std::unique_ptr<offload::NvmeStore> param_store;
  std::unique_ptr<offload::PinnedPool> param_buffers;
  std::unique_ptr<offload::ShardCache> param_cache;
  offload::ShardCacheStats param_io_mark;  // cache counters when the last step ended
  shard::ParamStorage param_access;        // holds the host copy of device parameters, reused
};

// A unit's fp32 master and optimizer state as checkpoints, exports, SetParam, GatherUnit and initialisation
// see it, one kind (optim::StateKind) over its update range at a time, wherever it lives (device, pinned
// host or NVMe tiles); never on the step's hot path. Chosen per unit at Finalize (Note [Unit owners]): a
// frozen unit's master is its param storage and it keeps no other kind (Note [Frozen units]); a trained
// unit's kinds are the optim::StateStore's.
class StateOwner {
 public:
  virtual ~StateOwner() = default;
  virtual std::vector<optim::StateKind> kinds() const = 0;  // master first
  virtual absl::StatusOr<std::vector<float>> Read(UnitState& u, optim::StateKind kind) = 0;
  virtual absl::Status Write(UnitState& u, optim::StateKind kind, const std::vector<float>& values) = 0;
  // The kind over the update range in place where the CPU can reach it (optim::StateStore::Lend), to read or
  // change there; nullopt where the caller stages it through Read and Write (device memory, NVMe, a frozen
  // unit's master).
  virtual std::optional<absl::Span<float>> Lend(UnitState& u, optim::StateKind kind) = 0;
  // After the master was written (a restore): the param storage from `master`, host memory over the update
  // range. Nothing for a frozen unit, whose master is its params.
  virtual absl::Status MasterToParams(UnitState& u, const float* master) = 0;
  // A snapshot of the kind that costs no copy (optim::StateStore::Snapshot: NVMe tiles), else null.
  virtual std::unique_ptr<optim::KindSnapshot> Snapshot(UnitState& u, optim::StateKind kind) = 0;
  // Whether its kinds live in NVMe tiles, so a checkpoint lays them out as tiles (Note [NVMe lanes laid out as
  // tiles] in checkpoint/shard_file.h).
  virtual bool tiled() const { return false; }
};

// Note [Tier placement] and Note [Placement] (placement.h): which tier each buffer lives on, and the
// storage the units' own buffers do not hold. Engine::Impl's, over its runtime and configuration.
struct UnitStorage {
  UnitStorage(EngineRuntime& runtime, const EngineConfig& config) : rt(runtime), cfg(config) {}
  EngineRuntime& rt;
  const EngineConfig& cfg;

  ParamStore pstore;
  // The NVMe state's store from ReserveNvme to SetUpNvme, holding the state once, and the state's bytes.
  std::unique_ptr<offload::NvmeStore> reserved_state_store;
  uint64_t state_store_bytes = 0;
  Placement place;  // decided once, in Create (Note [Placement])
  // The fp32 master and the optimizer state of every unit, wherever they live (optim/state_store.h):
  // optim::MemoryState (device or pinned-host buffers) or optim::NvmeState (the store, the staging tiles
  // and every unit's lanes), picked once in SetUpState (SetUpNvme for NVMe) from place.state.
  std::unique_ptr<optim::StateStore> state;
  // Each unit's access to it (UnitState::state), made in SetUpState.
  std::unique_ptr<StateOwner> frozen_state, trained_state;

  // Decides `place` over the current tiers, whose pointers it holds; again whenever a tier is replaced
  // (on CUDA, SetUpCuda replaces the pinned-host tier and CreateDeviceArena the device tier).
  void DecidePlace() { place = DecidePlacement(cfg, rt.device_alloc.get(), rt.host_alloc.get()); }
  bool separate_master() const { return place.master_apart; }
  memory::Allocator& ParamTier() const {
    return cfg.offload_param.device == OffloadDevice::kNone ? *rt.device_alloc : *rt.host_alloc;
  }
  // offload_optimizer = nvme: the master and state in tiles on NVMe (Note [NVMe state] in
  // optim/nvme_state.h).
  bool nvme_optimizer() const { return cfg.offload_optimizer.device == OffloadDevice::kNvme; }
  // offload_param = nvme: parameter shards on NVMe behind a pinned cache (Note [NVMe params] in
  // shard/param_source.h); the fp32 master is then always a separate buffer (separate_master()).
  bool nvme_params() const { return cfg.offload_param.device == OffloadDevice::kNvme; }
  size_t param_bytes() const { return DTypeBytes(cfg.param_dtype); }
  memory::Allocator& OptimizerTier() const { return *place.grads; }  // the gradients live with the optimizer
  memory::TierOps& ParamOps() const { return rt.OpsOf(ParamTier()); }
  memory::TierOps& OptimizerOps() const { return rt.OpsOf(OptimizerTier()); }
  memory::TierOps& MasterOps() const { return separate_master() ? OptimizerOps() : ParamOps(); }
  optim::TierUpdate& OptimizerUpdate() const { return rt.UpdateOf(OptimizerTier()); }
  // Only at stages 2-3 on CUDA: SetUpCuda refuses optimizer offload below stage 2.
  bool GradStagingNeeded() const {
    return !rt.device_ops->host_visible() && place.grads->tier() != memory::Tier::kDevice;
  }
  // The gradient memory's alignment on `tier`: 2 MiB with strata.release_idle_memory where the tier hands
  // pages back, so the pages faulted in again after each step are huge pages (Note [Huge pages],
  // runtime/offload/pinned_pool.cc; Note [Idle pages]); 64 otherwise (a device arena is sized to the byte).
  size_t GradAlignment(const memory::Allocator* tier) const {
    return cfg.release_idle_memory && tier != nullptr && tier->hands_back_pages() ? size_t{2} << 20 : 64;
  }
  // The kinds this run's optimizer keeps, master first (optim::StateKinds).
  std::vector<optim::StateKind> state_kinds() const { return optim::StateKinds(cfg.optimizer.type); }

  // At Finalize, Note [NVMe room agreed]: the disk the NVMe state needs (ReserveNvme) and the NVMe parameter
  // cache (SetUpNvmeParams: nothing without NVMe params), reserved on every rank before any rank takes the room
  // for the state's redirects (SetUpNvme: then the NVMe state, before the units' buffers; nothing without NVMe
  // state); after the units' buffers the memory-resident state, whose master / state buffers are `held`, and
  // each unit's StateOwner.
  absl::Status ReserveNvme(const std::vector<UnitState>& units, size_t tile_elems);
  absl::Status SetUpNvmeParams(const std::vector<UnitState>& units, int live, size_t largest_shard);
  absl::Status SetUpNvme(const std::vector<UnitState>& units, size_t tile_elems);
  absl::Status SetUpState(std::vector<UnitState>& units, std::vector<optim::MemoryUnit> held);

  // Opens bytes [offset, offset + bytes) of the rank's parameter storage (what u.params holds: the shard at
  // stage 3, the whole unit otherwise) in host memory (shard/param_storage.h): in place where the CPU reaches
  // it, else a host copy that CloseParams writes back (device memory: only that range; NVMe: through the
  // cache). keep = false: the caller overwrites the whole range, so it is not read first. nullptr for an
  // empty range, which opens nothing. One range is open at a time.
  absl::StatusOr<char*> OpenParams(UnitState& u, size_t offset, size_t bytes, bool keep);
  // Ends the access to the open range: written back when `done` (the caller's work on it) is OK, unless the
  // caller only `read` it. Returns the write-back's error, else `done`.
  absl::Status CloseParams(const absl::Status& done, bool read = false);
  // That range as the parameter storage opens it (shard/param_storage.h).
  shard::ParamRange ParamRangeOf(UnitState& u, size_t offset, size_t bytes) const;
  // Where this rank's update range starts in its parameter storage, in bytes.
  size_t UpdateParamOffset(const UnitState& u) const;
  // OpenParams over this rank's update range, which the caller overwrites whole (casts of the master).
  absl::StatusOr<char*> OpenUpdateParams(UnitState& u);
  float* MasterPtr(UnitState& u, const memory::Buffer& master) const;  // update range of the fp32 master
  // The param storage over the update range from `master` (host memory, the update range of the fp32
  // master); nothing when the master is the param storage itself.
  absl::Status CastMasterToParams(UnitState& u, const float* master);
  // The step's view of unit u: `grad` the update range of its gradients, `segments` its update segments
  // of this step (Note [Parameters without a gradient]).
  optim::StepUnit StepUnitOf(UnitState& u, float* grad, const std::vector<shard::Segment>* segments);
};

}  // namespace strata::engine
