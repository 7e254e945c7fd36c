// The optimizer state's set-up (Note [NVMe state] in engine_impl.h): the NVMe tiles or the memory-resident
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

absl::Status Engine::Impl::SetUpNvme(size_t tile_elems) {
  if (!nvme_optimizer()) return absl::OkStatus();
  const std::string& path = cfg.offload_optimizer.nvme_path;
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_optimizer", path));
  std::vector<size_t> elems;
  for (const UnitState& u : units) elems.push_back(update_elems(u));
  const uint64_t need = optim::NvmeState::StoreBytes(tile_elems, state_kinds().size(), elems);
  STRATA_RETURN_IF_ERROR(CreateIoQueue());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::NvmeStore> store,
                          offload::NvmeStore::Create(StoreOptions(*this, path, "optimizer", need), io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<offload::PinnedPool> staging,
                          offload::PinnedPool::Create(PoolOptions(*this, NvmeStagingTiles(cfg), tile_elems * 4,
                                                                  memory::Kind::kScratch,
                                                                  cfg.offload_optimizer.pin_memory),
                                                      host_alloc.get()));
  io_queue->RegisterBuffers(staging->buffers()).IgnoreError();  // a hint; fine without
  STRATA_ASSIGN_OR_RETURN(state, optim::NvmeState::Create(std::move(store), std::move(staging), tile_elems,
                                                               state_kinds(), std::move(elems)));
  return absl::OkStatus();
}

namespace {
// The tier's operations as the memory-resident state takes them (optim/memory_state.h).
optim::MemoryOps MemoryOpsOf(TierOps& t) {
  optim::MemoryOps ops;
  ops.host_visible = t.host_visible();
  ops.to_host = [&t](void* host, const void* src, size_t bytes) { return t.ToHost(host, src, bytes); };
  ops.from_host = [&t](void* dst, const void* host, size_t bytes) { return t.FromHost(dst, host, bytes); };
  ops.update = [&t](const optim::OptimizerConfig& cfg, const optim::ShardState& s,
                    const std::vector<shard::Segment>& segs, double lr, int64_t step, float grad_scale,
                    uint16_t* param_copy, DType copy_dtype) {
    return t.Update(cfg, s, segs, lr, step, grad_scale, param_copy, copy_dtype);
  };
  ops.cast = [&t](DType to, const float* src, void* dst, size_t n) { return t.Cast(to, src, dst, n); };
  return ops;
}
}  // namespace

absl::Status Engine::Impl::SetUpState(std::vector<optim::MemoryUnit> held) {
  if (place.state == nullptr) return absl::OkStatus();  // on NVMe: SetUpNvme made it before the units' buffers
  state = std::make_unique<optim::MemoryState>(MemoryOpsOf(MasterOps()), MemoryOpsOf(OptimizerOps()),
                                               separate_master(), std::move(held));
  return absl::OkStatus();
}

}  // namespace strata::engine
