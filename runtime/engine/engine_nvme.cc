// The NVMe tier of the optimizer (Note [NVMe state] in engine_impl.h): set-up, the tiled update, and
// staging one unit's lane in memory for export, SetParam and checkpoints.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/nvme_state.h"

namespace strata::engine {

absl::Status Engine::Impl::CreateIoQueue() {
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
  so.files.rank = m.rank();
  so.files.name = name;
  so.files.capacity_bytes = std::max<uint64_t>(need, offload::NvmeStore::kAlignment);
  so.tracker = &m.tracker;
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
  const bool cuda = m.device->kind() == device::DeviceKind::kCuda;
  po.pin = pin && !cuda ? offload::PinMethod::kMlock : offload::PinMethod::kNone;
  return po;
}
}  // namespace

absl::Status Engine::Impl::SetUpNvmeParams(int live, size_t largest_shard) {
  if (!nvme_params()) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_param", cfg.offload_param.nvme_path));
  STRATA_RETURN_IF_ERROR(CreateIoQueue());
  std::vector<uint64_t> bytes;
  uint64_t need = 0;
  for (const UnitState& u : units) {
    bytes.push_back(u.layout.shard_elems * param_bytes());
    need += offload::NvmeStore::IoBytes(std::max<uint64_t>(bytes.back(), 1));
  }
  STRATA_ASSIGN_OR_RETURN(param_store, offload::NvmeStore::Create(
                                           StoreOptions(*this, cfg.offload_param.nvme_path, "params", need),
                                           io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(param_buffers,
                          offload::PinnedPool::Create(PoolOptions(*this, NvmeParamBuffers(cfg, live),
                                                                  std::max<size_t>(largest_shard * param_bytes(), 1),
                                                                  memory::Kind::kParamShard,
                                                                  cfg.offload_param.pin_memory),
                                                      host_alloc.get()));
  STRATA_ASSIGN_OR_RETURN(param_cache, offload::ShardCache::Create(param_store.get(), param_buffers.get(),
                                                                   std::move(bytes), memory::Kind::kParamShard));
  return absl::OkStatus();
}

absl::Status Engine::Impl::ParamStorage(UnitState& u, size_t offset, size_t bytes,
                                         const std::function<absl::Status(char* p)>& fn, bool keep) {
  if (bytes == 0) return absl::OkStatus();
  if (nvme_params()) {  // the cache writes whole shards: a part of one keeps the rest
    const int unit = static_cast<int>(&u - units.data());
    const bool whole = offset == 0 && bytes == u.layout.shard_elems * param_bytes();
    return param_cache->Write(unit, [&](void* dst) { return fn(static_cast<char*>(dst) + offset); }, keep || !whole);
  }
  if (ParamOps().host_visible()) return fn(u.params.as<char>() + offset);
  // Device memory: through a host copy of the range.
  param_scratch.resize(std::max(param_scratch.size(), bytes));
  char* host = param_scratch.data();
  char* dev = u.params.as<char>() + offset;
  if (keep) STRATA_RETURN_IF_ERROR(ParamOps().ToHost(host, dev, bytes));
  STRATA_RETURN_IF_ERROR(fn(host));
  return ParamOps().FromHost(dev, host, bytes);
}

absl::Status Engine::Impl::SetUpNvme() {
  if (!nvme_optimizer()) return absl::OkStatus();
  const std::string& path = cfg.offload_optimizer.nvme_path;
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_optimizer", path));
  std::vector<size_t> elems;
  for (const UnitState& u : units) elems.push_back(u.frozen() ? 0 : update_elems(u));  // Note [Frozen units]
  const uint64_t need = optim::NvmeState::StoreBytes(nvme_tile_elems, state_kinds().size(), elems);
  STRATA_RETURN_IF_ERROR(CreateIoQueue());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::NvmeStore> store,
                          offload::NvmeStore::Create(StoreOptions(*this, path, "optimizer", need), io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::PinnedPool> staging,
                          offload::PinnedPool::Create(PoolOptions(*this, NvmeStagingTiles(cfg), nvme_tile_elems * 4,
                                                                  memory::Kind::kScratch,
                                                                  cfg.offload_optimizer.pin_memory),
                                                      host_alloc.get()));
  io_queue->RegisterBuffers(staging->buffers()).IgnoreError();  // a hint; fine without
  STRATA_ASSIGN_OR_RETURN(nvme_state, optim::NvmeState::Create(std::move(store), std::move(staging), nvme_tile_elems,
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

// Note [Frozen units]. ParamStorage hands out the range itself in host memory, or a host copy (keep: read
// first); with NVMe params the cache writes the unchanged shard back, which only checkpoints and exports
// pay.
absl::StatusOr<std::vector<float>> Engine::Impl::ReadFrozen(UnitState& u) {
  std::vector<float> out(update_elems(u));
  STRATA_RETURN_IF_ERROR(ParamStorage(u, UpdateParamOffset(u), out.size() * param_bytes(), [&](char* params) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAs(cfg.param_dtype, params, i);
    return absl::OkStatus();
  }, /*keep=*/true));
  return out;
}

absl::Status Engine::Impl::WriteFrozen(UnitState& u, const std::vector<float>& values) {
  return UpdateParamStorage(u, [&](char* params) {
    return host_ops->Cast(cfg.param_dtype, values.data(), params, values.size());
  });
}

absl::StatusOr<std::vector<float>> Engine::Impl::ReadState(UnitState& u, optim::StateKind kind) {
  if (u.frozen()) {
    if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
    return ReadFrozen(u);
  }
  if (nvme_optimizer()) return nvme_state->Read(static_cast<int>(&u - units.data()), kind);
  std::vector<float> out(update_elems(u));
  STRATA_RETURN_IF_ERROR(StateOps(kind).ToHost(out.data(), StatePtr(u, kind), out.size() * 4));
  return out;
}

absl::Status Engine::Impl::WriteState(UnitState& u, optim::StateKind kind, const std::vector<float>& values) {
  if (u.frozen()) {
    if (kind != optim::StateKind::kMaster) return NoFrozenState(u, kind);
    return WriteFrozen(u, values);
  }
  if (nvme_optimizer()) return nvme_state->Write(static_cast<int>(&u - units.data()), kind, values);
  return StateOps(kind).FromHost(StatePtr(u, kind), values.data(), values.size() * 4);
}

absl::Status Engine::Impl::EditState(UnitState& u, optim::StateKind kind, const std::function<void(float*)>& fn,
                                     bool write_back) {
  if (!u.frozen() && !nvme_optimizer() && StateOps(kind).host_visible()) {
    fn(StatePtr(u, kind));
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<float> staged, ReadState(u, kind));
  fn(staged.data());
  return write_back ? WriteState(u, kind, staged) : absl::OkStatus();
}

absl::Status Engine::Impl::NvmeUpdate(UnitState& u, double lr, float clip_coef) {
  return UpdateParamStorage(u, [&](char* params) -> absl::Status {
    optim::TiledUpdate up{GradUpdatePtr(u), &u.ext.update_segments, params, cfg.param_dtype, lr, step + 1, clip_coef,
                          host_executor.get()};
    STRATA_ASSIGN_OR_RETURN(offload::TilePipelineStats stats,
                            nvme_state->Update(static_cast<int>(&u - units.data()), cfg.optimizer, up));
    exposed_io_ns += stats.read_wait_ns + stats.write_wait_ns;
    nvme_read_bytes += stats.bytes_read;
    nvme_write_bytes += stats.bytes_written;
    return absl::OkStatus();
  });  // the tiles cover the whole update range
}

}  // namespace strata::engine
