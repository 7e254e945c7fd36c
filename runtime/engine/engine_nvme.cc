// The optimizer state's set-up (Note [NVMe state] in optim/nvme_state.h): the NVMe tiles or the memory-resident
// state (optim/state_store.h), and the NVMe parameter cache (Note [NVMe params]).
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
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
offload::NvmeStoreOptions StoreOptions(Engine::Impl& m, const std::string& path, const char* name, uint64_t need) {
  offload::NvmeStoreOptions so;
  so.files.paths = {path};
  so.files.rank = m.rt.rank();
  so.files.name = name;
  so.files.capacity_bytes = std::max<uint64_t>(need, offload::NvmeStore::kAlignment);
  so.tracker = &m.rt.tracker;
  return so;
}

// Staging buffers are page-locked with mlock on host devices unless pin_memory is off. On CUDA devices
// the pinned-host tier's allocator has already registered them with CUDA (memory::CudaHostAllocator;
// registering twice fails with cudaErrorHostMemoryAlreadyRegistered), so the pool pins nothing itself.
offload::PinnedPoolOptions PoolOptions(const Engine::Impl& m, size_t count, size_t bytes, memory::Kind kind, bool pin) {
  offload::PinnedPoolOptions po;
  po.buffer_count = count;
  po.buffer_bytes = bytes;
  po.kind = kind;
  const bool cuda = m.rt.device->kind() == device::DeviceKind::kCuda;
  po.pin = pin && !cuda ? offload::PinMethod::kMlock : offload::PinMethod::kNone;
  return po;
}
}  // namespace

absl::Status Engine::Impl::SetUpNvmeParams(int live, size_t largest_shard) {
  if (!nvme_params()) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_param", cfg.offload_param.nvme_path));
  STRATA_RETURN_IF_ERROR(rt.CreateIoQueue());
  std::vector<uint64_t> bytes;
  uint64_t need = 0;
  for (const UnitState& u : units) {
    bytes.push_back(u.layout.shard_elems * param_bytes());
    need += offload::NvmeStore::IoBytes(std::max<uint64_t>(bytes.back(), 1));
  }
  STRATA_ASSIGN_OR_RETURN(pstore.param_store, offload::NvmeStore::Create(
                                           StoreOptions(*this, cfg.offload_param.nvme_path, "params", need),
                                           rt.io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(pstore.param_buffers,
                          offload::PinnedPool::Create(PoolOptions(*this, NvmeParamBuffers(cfg, live),
                                                                  std::max<size_t>(largest_shard * param_bytes(), 1),
                                                                  memory::Kind::kParamShard,
                                                                  cfg.offload_param.pin_memory),
                                                      rt.host_alloc.get()));
  STRATA_ASSIGN_OR_RETURN(pstore.param_cache,
                          offload::ShardCache::Create(pstore.param_store.get(), pstore.param_buffers.get(),
                                                      std::move(bytes), memory::Kind::kParamShard));
  return absl::OkStatus();
}

absl::Status Engine::Impl::ParamStorage(UnitState& u, size_t offset, size_t bytes,
                                         const std::function<absl::Status(char* p)>& fn, bool keep) {
  if (bytes == 0) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(char* p, pstore.param_access.Open(ParamRangeOf(u, offset, bytes), keep));
  const absl::Status s = fn(p);
  STRATA_RETURN_IF_ERROR(pstore.param_access.Close(s.ok()));
  return s;
}

shard::ParamRange Engine::Impl::ParamRangeOf(UnitState& u, size_t offset, size_t bytes) const {
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

absl::Status Engine::Impl::SetUpNvme(size_t tile_elems) {
  if (!nvme_optimizer()) return absl::OkStatus();
  const std::string& path = cfg.offload_optimizer.nvme_path;
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_optimizer", path));
  std::vector<size_t> elems;
  for (const UnitState& u : units) elems.push_back(u.frozen() ? 0 : u.update_elems());  // Note [Frozen units]
  const uint64_t need = optim::NvmeState::StoreBytes(tile_elems, state_kinds().size(), elems);
  STRATA_RETURN_IF_ERROR(rt.CreateIoQueue());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::NvmeStore> store,
                          offload::NvmeStore::Create(StoreOptions(*this, path, "optimizer", need), rt.io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::PinnedPool> staging,
                          offload::PinnedPool::Create(PoolOptions(*this, NvmeStagingTiles(cfg), tile_elems * 4,
                                                                  memory::Kind::kScratch,
                                                                  cfg.offload_optimizer.pin_memory),
                                                      rt.host_alloc.get()));
  rt.io_queue->RegisterBuffers(staging->buffers()).IgnoreError();  // a hint; fine without
  STRATA_ASSIGN_OR_RETURN(state, optim::NvmeState::Create(std::move(store), std::move(staging), tile_elems,
                                                               state_kinds(), std::move(elems)));
  return absl::OkStatus();
}

namespace {
float LoadAs(DType dtype, const char* base, size_t index) {
  switch (dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(base)[index];
    case DType::kBF16: return kernels::Bf16ToFloat(reinterpret_cast<const uint16_t*>(base)[index]);
    case DType::kF16: return kernels::HalfToFloat(reinterpret_cast<const uint16_t*>(base)[index]);
  }
  return 0;
}
// A broken internal invariant: nothing asks a frozen unit for optimizer state (state_kinds(u)).
absl::Status NoFrozenState(const UnitState& u, optim::StateKind kind) {
  return absl::InternalError(
      absl::StrCat("frozen unit '", u.layout.name, "' has no ", std::string(optim::StateKindName(kind))));
}
}  // namespace

// A frozen unit's master (Note [Frozen units] in placement.h): ParamStorage hands out the range itself in
// host memory, or a host copy (keep: read first); with NVMe params the cache writes the unchanged shard back,
// which only checkpoints and exports pay.
absl::StatusOr<std::vector<float>> Engine::Impl::ReadFrozen(UnitState& u, optim::StateKind kind) {
  if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
  std::vector<float> out(u.update_elems());
  STRATA_RETURN_IF_ERROR(ParamStorage(u, UpdateParamOffset(u), out.size() * param_bytes(), [&](char* params) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAs(cfg.param_dtype, params, i);
    return absl::OkStatus();
  }, /*keep=*/true));
  return out;
}

absl::Status Engine::Impl::WriteFrozen(UnitState& u, optim::StateKind kind, const std::vector<float>& values) {
  if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
  return UpdateParamStorage(u, [&](char* params) {
    return rt.host_ops->Cast(cfg.param_dtype, values.data(), params, values.size());
  });
}

absl::Status Engine::Impl::EditState(UnitState& u, optim::StateKind kind, const std::function<void(float*)>& fn,
                                     bool write_back) {
  if (!u.frozen()) return state->Edit(u.index, kind, fn, write_back);
  STRATA_ASSIGN_OR_RETURN(std::vector<float> staged, ReadFrozen(u, kind));
  fn(staged.data());
  return write_back ? WriteFrozen(u, kind, staged) : absl::OkStatus();
}

absl::Status Engine::Impl::SetUpState(std::vector<optim::MemoryUnit> held) {
  if (place.state == nullptr) return absl::OkStatus();  // on NVMe: SetUpNvme made it before the units' buffers
  state = std::make_unique<optim::MemoryState>(MasterOps(), OptimizerOps(), OptimizerUpdate(), separate_master(),
                                               std::move(held));
  return absl::OkStatus();
}

}  // namespace strata::engine
