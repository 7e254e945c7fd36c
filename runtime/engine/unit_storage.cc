// The units' storage (unit_storage.h): the optimizer state's set-up (Note [NVMe state] in optim/nvme_state.h:
// the NVMe tiles or the memory-resident state, optim/state_store.h), each unit's access to it (StateOwner:
// frozen or trained), the NVMe parameter cache (Note [NVMe params]) and the host access to a range of the
// parameter storage.
#include "runtime/engine/unit_storage.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/nvme_state.h"

namespace strata::engine {

absl::Status EngineRuntime::CreateIoQueue() {
  if (io_queue != nullptr) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(io_queue, offload::CreateIoQueue(offload::IoQueueOptions{}));
  return absl::OkStatus();
}

namespace {
absl::Status CheckNvmePath(const char* which, const std::string& path) {
  if (!std::filesystem::is_directory(path)) {
    return absl::NotFoundError(absl::StrCat(which, ".nvme_path '", path, "' is not a directory"));
  }
  return absl::OkStatus();
}

// The options of one of the rank's stores: files "<name>" under `path`, sized for `need` bytes.
offload::NvmeStoreOptions StoreOptions(EngineRuntime& rt, const std::string& path, const char* name, uint64_t need) {
  offload::NvmeStoreOptions so;
  so.files.paths = {path};
  so.files.rank = rt.rank();
  so.files.name = name;
  so.files.capacity_bytes = std::max<uint64_t>(need, offload::NvmeStore::kAlignment);
  so.tracker = &rt.tracker;
  return so;
}

// Staging buffers are page-locked with mlock on host devices unless pin_memory is off. On CUDA devices
// the pinned-host tier's allocator has already registered them with CUDA (memory::CudaHostAllocator;
// registering twice fails with cudaErrorHostMemoryAlreadyRegistered), so the pool pins nothing itself.
offload::PinnedPoolOptions PoolOptions(const EngineRuntime& rt, size_t count, size_t bytes, memory::Kind kind,
                                       bool pin) {
  offload::PinnedPoolOptions po;
  po.buffer_count = count;
  po.buffer_bytes = bytes;
  po.kind = kind;
  const bool cuda = rt.device->kind() == device::DeviceKind::kCuda;
  po.pin = pin && !cuda ? offload::PinMethod::kMlock : offload::PinMethod::kNone;
  return po;
}
}  // namespace

absl::Status UnitStorage::SetUpNvmeParams(const std::vector<UnitState>& units, int live, size_t largest_shard) {
  if (!nvme_params()) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_param", cfg.offload_param.nvme_path));
  STRATA_RETURN_IF_ERROR(rt.CreateIoQueue());
  std::vector<uint64_t> bytes;
  uint64_t need = 0;
  for (const UnitState& u : units) {
    bytes.push_back(u.layout.shard_elems * param_bytes());
    need += offload::NvmeStore::IoBytes(std::max<uint64_t>(bytes.back(), 1));
  }
  STRATA_ASSIGN_OR_RETURN(
      pstore.param_store,
      offload::NvmeStore::Create(StoreOptions(rt, cfg.offload_param.nvme_path, "params", need), rt.io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(
      pstore.param_buffers,
      offload::PinnedPool::Create(
          PoolOptions(rt, NvmeParamBuffers(cfg, live), std::max<size_t>(largest_shard * param_bytes(), 1),
                      memory::Kind::kParamShard, cfg.offload_param.pin_memory),
          rt.host_alloc.get()));
  STRATA_ASSIGN_OR_RETURN(pstore.param_cache,
                          offload::ShardCache::Create(pstore.param_store.get(), pstore.param_buffers.get(),
                                                      std::move(bytes), memory::Kind::kParamShard));
  return absl::OkStatus();
}

absl::StatusOr<char*> UnitStorage::OpenParams(UnitState& u, size_t offset, size_t bytes, bool keep) {
  if (bytes == 0) return nullptr;
  return pstore.param_access.Open(ParamRangeOf(u, offset, bytes), keep);
}

absl::Status UnitStorage::CloseParams(const absl::Status& done, bool read) {
  if (read) {
    pstore.param_access.CloseRead();
    return done;
  }
  STRATA_RETURN_IF_ERROR(pstore.param_access.Close(done.ok()));
  return done;
}

shard::ParamRange UnitStorage::ParamRangeOf(UnitState& u, size_t offset, size_t bytes) const {
  shard::ParamRange r;
  r.ops = &ParamOps();
  r.cache = nvme_params() ? pstore.param_cache.get() : nullptr;  // then the cache holds the shards (no u.params)
  r.unit = u.index;
  r.params = u.params.as<char>();
  r.shard_bytes = u.layout.shard_elems * param_bytes();
  r.offset = offset;
  r.bytes = bytes;
  return r;
}

absl::Status UnitStorage::ReserveNvme(const std::vector<UnitState>& units, size_t tile_elems) {
  if (!nvme_optimizer()) return absl::OkStatus();
  const std::string& path = cfg.offload_optimizer.nvme_path;
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_optimizer", path));
  std::vector<size_t> elems;
  for (const UnitState& u : units) elems.push_back(u.frozen() ? 0 : u.update_elems());  // Note [Frozen units]
  state_store_bytes = optim::NvmeState::StoreBytes(tile_elems, state_kinds().size(), elems);
  STRATA_RETURN_IF_ERROR(rt.CreateIoQueue());
  STRATA_ASSIGN_OR_RETURN(
      reserved_state_store,
      offload::NvmeStore::Create(StoreOptions(rt, path, "optimizer", state_store_bytes), rt.io_queue.get()));
  return absl::OkStatus();
}

absl::Status UnitStorage::SetUpNvme(const std::vector<UnitState>& units, size_t tile_elems) {
  if (!nvme_optimizer()) return absl::OkStatus();
  STRATA_CHECK_MSG(reserved_state_store != nullptr, "SetUpNvme before ReserveNvme");
  // Twice the state: room for the tiles the steps write apart from those an asynchronous save still holds
  // (Note [Snapshots of NVMe state]); without it they wait for the save's writer. A disk with room for the
  // state but not for twice it still trains, with that wait: the room is a speed, not a need, so it is taken
  // only after every store of every rank holds what it needs (Note [NVMe room agreed]).
  if (absl::Status grown = reserved_state_store->Grow(2 * state_store_bytes); !grown.ok()) {
    if (!absl::IsResourceExhausted(grown)) return grown;
    STRATA_LOG(Warning) << "offload_optimizer: no room on " << cfg.offload_optimizer.nvme_path
                        << " for twice the optimizer state (" << grown.message() << "); the state is preallocated "
                        << "once: steps taken while an asynchronous checkpoint is written will wait for its writer";
  }
  std::vector<size_t> elems;
  for (const UnitState& u : units) elems.push_back(u.frozen() ? 0 : u.update_elems());
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<offload::PinnedPool> staging,
      offload::PinnedPool::Create(PoolOptions(rt, NvmeStagingTiles(cfg), tile_elems * 4, memory::Kind::kScratch,
                                              cfg.offload_optimizer.pin_memory),
                                  rt.host_alloc.get()));
  rt.io_queue->RegisterBuffers(staging->buffers()).IgnoreError();  // a hint; fine without
  STRATA_ASSIGN_OR_RETURN(state, optim::NvmeState::Create(std::move(reserved_state_store), std::move(staging),
                                                          tile_elems, state_kinds(), std::move(elems)));
  return absl::OkStatus();
}

namespace {
// A broken internal invariant: nothing asks a frozen unit for optimizer state (its kinds() are the master).
absl::Status NoFrozenState(const UnitState& u, optim::StateKind kind) {
  return absl::InternalError(
      absl::StrCat("frozen unit '", u.layout.name, "' has no ", std::string(optim::StateKindName(kind))));
}

// Note [Frozen units in a snapshot]: a frozen unit's master is its param storage (Note [Frozen units] in
// placement.h), which no step writes. At stage 3 nothing else reaches that storage but SetParam: the compute
// reads gathered copies (Note [Unit owners]), so a forward that writes a parameter in place (nn.Embedding's
// max_norm renormalises the rows it looks up) writes the copy. And Engine::SetParamRanges first waits for a save
// that holds frozen params in place (AsyncSaver::Settle). So there an asynchronous save holds them in place, in
// host memory, and its writer reads them as the float master a copy would have held (optim::InPlaceSnapshot,
// through FrozenState::Read's conversion, optim::ReadAsFloats), with no host copy: a LoRA adapter over a large
// frozen base saves with the adapter's state copied and the base held as it is. At stages 0-2 the compute's
// view is the storage itself, which such a forward writes while the save reads it: copied there, as are params
// in device memory (docs/decisions/0050-frozen-units-held-in-place.md). With parameter shards on NVMe the save
// holds each shard's extent instead (offload::ShardCache::Hold, Note [Held shards]: a write of the shard waits
// until the writer read past it, and the forward only ever sees gathered copies) and the writer reads it back
// through one shard of staging (optim::NvmeShardSnapshot): a model whose base does not fit the rank's memory
// saves with no copy of it (docs/decisions/0052-frozen-nvme-shards-held.md).

// A frozen unit's master (Note [Frozen units] in placement.h): OpenParams hands out the range itself in
// host memory, or a host copy (keep: read first), which Read leaves unwritten (with NVMe params the cache
// keeps its buffer of the shard as it is). It has no other kind.
class FrozenState : public StateOwner {
 public:
  explicit FrozenState(UnitStorage& s) : s_(s) {}
  std::vector<optim::StateKind> kinds() const override { return {optim::StateKind::kMaster}; }
  absl::StatusOr<std::vector<float>> Read(UnitState& u, optim::StateKind kind) override {
    if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
    std::vector<float> out(u.update_elems());
    STRATA_ASSIGN_OR_RETURN(char* params,
                            s_.OpenParams(u, s_.UpdateParamOffset(u), out.size() * s_.param_bytes(), /*keep=*/true));
    if (params == nullptr) return out;
    optim::ReadAsFloats(params, s_.cfg.param_dtype, out.size(), out.data());  // as the snapshots read it
    STRATA_RETURN_IF_ERROR(s_.CloseParams(absl::OkStatus(), /*read=*/true));
    return out;
  }
  absl::Status Write(UnitState& u, optim::StateKind kind, const std::vector<float>& values) override {
    if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
    STRATA_ASSIGN_OR_RETURN(char* params, s_.OpenUpdateParams(u));
    if (params == nullptr) return absl::OkStatus();
    return s_.CloseParams(s_.rt.host_ops->Cast(s_.cfg.param_dtype, values.data(), params, values.size()));
  }
  // Its master is staged (Read, then Write): the param storage, in the param dtype.
  std::optional<absl::Span<float>> Lend(UnitState&, optim::StateKind) override { return std::nullopt; }
  absl::Status MasterToParams(UnitState&, const float*) override { return absl::OkStatus(); }
  // Its master is the param storage: held at stage 3 where the CPU reaches it, in place, or in the NVMe
  // parameter cache, by its extent (Note [Frozen units in a snapshot]); else copied by the caller.
  std::unique_ptr<optim::KindSnapshot> Snapshot(UnitState& u, optim::StateKind kind) override {
    if (kind != optim::StateKind::kMaster || s_.cfg.stage != 3 || u.update_elems() == 0) return nullptr;
    const size_t first = s_.UpdateParamOffset(u) / s_.param_bytes();
    if (s_.nvme_params()) {
      offload::ShardCache& cache = *s_.pstore.param_cache;
      absl::StatusOr<offload::NvmeExtent> shard = cache.Hold(u.index);
      if (!shard.ok() || shard->empty()) return nullptr;  // copied: the copy reports the write's error
      return optim::NvmeShardSnapshot(cache.store(), cache.let_go(), *std::move(shard), first, u.update_elems(),
                                      s_.cfg.param_dtype);
    }
    if (!s_.ParamOps().host_visible()) return nullptr;
    const char* params = u.params.as<char>();
    if (params == nullptr) return nullptr;
    return optim::InPlaceSnapshot(params + s_.UpdateParamOffset(u), u.update_elems(), s_.cfg.param_dtype);
  }

 private:
  UnitStorage& s_;
};

// A trained unit's kinds are the StateStore's; its param storage follows its master by a cast.
class TrainedState : public StateOwner {
 public:
  explicit TrainedState(UnitStorage& s) : s_(s) {}
  std::vector<optim::StateKind> kinds() const override { return s_.state_kinds(); }
  absl::StatusOr<std::vector<float>> Read(UnitState& u, optim::StateKind kind) override {
    return s_.state->Read(u.index, kind);
  }
  absl::Status Write(UnitState& u, optim::StateKind kind, const std::vector<float>& values) override {
    return s_.state->Write(u.index, kind, values);
  }
  std::optional<absl::Span<float>> Lend(UnitState& u, optim::StateKind kind) override {
    return s_.state->Lend(u.index, kind);
  }
  absl::Status MasterToParams(UnitState& u, const float* master) override { return s_.CastMasterToParams(u, master); }
  std::unique_ptr<optim::KindSnapshot> Snapshot(UnitState& u, optim::StateKind kind) override {
    return s_.state->Snapshot(u.index, kind);
  }
  bool tiled() const override { return s_.nvme_optimizer(); }

 private:
  UnitStorage& s_;
};
}  // namespace

absl::Status UnitStorage::SetUpState(std::vector<UnitState>& units, std::vector<optim::MemoryUnit> held) {
  if (place.state != nullptr) {  // else on NVMe: SetUpNvme made it before the units' buffers
    state = std::make_unique<optim::MemoryState>(MasterOps(), OptimizerOps(), OptimizerUpdate(), separate_master(),
                                                 std::move(held));
  }
  // Note [Unit owners]: each unit's access to its state, chosen here once.
  frozen_state = std::make_unique<FrozenState>(*this);
  trained_state = std::make_unique<TrainedState>(*this);
  for (UnitState& u : units) u.state = u.frozen() ? frozen_state.get() : trained_state.get();
  return absl::OkStatus();
}

size_t UnitStorage::UpdateParamOffset(const UnitState& u) const {
  return (u.ext.update_begin - u.ext.param_begin) * param_bytes();
}

absl::StatusOr<char*> UnitStorage::OpenUpdateParams(UnitState& u) {
  return OpenParams(u, UpdateParamOffset(u), u.update_elems() * param_bytes(), /*keep=*/false);
}

float* UnitStorage::MasterPtr(UnitState& u, const memory::Buffer& master) const {
  // Apart from the params: `master`, which is empty (nullptr) with the master on NVMe, where
  // StateOwner::Read(u, kMaster) stages it.
  if (separate_master()) return master.as<float>();
  return u.params.as<float>() + (u.ext.update_begin - u.ext.param_begin);
}

// `master` is host memory; the param storage OpenParams hands out is too.
absl::Status UnitStorage::CastMasterToParams(UnitState& u, const float* master) {
  if (!separate_master()) return absl::OkStatus();  // the master is the param storage
  STRATA_ASSIGN_OR_RETURN(char* params, OpenUpdateParams(u));
  if (params == nullptr) return absl::OkStatus();
  return CloseParams(rt.host_ops->Cast(cfg.param_dtype, master, params, u.update_elems()));
}

optim::StepUnit UnitStorage::StepUnitOf(UnitState& u, float* grad, const std::vector<shard::Segment>* segments) {
  optim::ParamsAccess params;
  params.storage = &pstore.param_access;
  params.range = ParamRangeOf(u, UpdateParamOffset(u), u.update_elems() * param_bytes());
  // Device state updates device params in place (no param buffer with parameter shards on NVMe).
  params.in_place = u.params.data() == nullptr ? nullptr : u.params.as<char>() + UpdateParamOffset(u);
  return optim::StepUnit{grad, u.update_elems(), segments, std::move(params), u.index};
}

}  // namespace strata::engine
