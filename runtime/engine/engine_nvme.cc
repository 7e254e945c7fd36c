// The NVMe tier of the optimizer (Note [NVMe state] in engine_impl.h): set-up, the tiled update, and
// staging one unit's lane in memory for export, SetParam and checkpoints.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "offload/tiled_pipeline.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/optimizer.h"

namespace strata::engine {


namespace {

size_t Tiles(const Engine::Impl& m, const UnitState& u) {
  return (m.update_elems(u) + m.nvme_tile_elems - 1) / m.nvme_tile_elems;
}

size_t TileElems(const Engine::Impl& m, const UnitState& u, size_t t) {
  return std::min(m.nvme_tile_elems, m.update_elems(u) - t * m.nvme_tile_elems);
}

}  // namespace

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
  if (!nvme_params() && ParamOps().host_visible()) return fn(u.params.as<char>() + offset);
  if (!nvme_params()) {  // device memory: through a host copy of the range
    param_scratch.resize(std::max(param_scratch.size(), bytes));
    char* host = param_scratch.data();
    char* dev = u.params.as<char>() + offset;
    if (keep) STRATA_RETURN_IF_ERROR(ParamOps().ToHost(host, dev, bytes));
    STRATA_RETURN_IF_ERROR(fn(host));
    return ParamOps().FromHost(dev, host, bytes);
  }
  // The cache writes whole shards: a part of one keeps the rest.
  const int unit = static_cast<int>(&u - units.data());
  const bool whole = offset == 0 && bytes == u.layout.shard_elems * param_bytes();
  return param_cache->Write(unit, [&](void* dst) { return fn(static_cast<char*>(dst) + offset); }, keep || !whole);
}

absl::Status Engine::Impl::SetUpNvme() {
  const std::string& path = cfg.offload_optimizer.nvme_path;
  STRATA_RETURN_IF_ERROR(CheckNvmePath("offload_optimizer", path));
  uint64_t need = 0;
  for (const UnitState& u : units) {
    for (size_t t = 0; t < Tiles(*this, u); ++t) need += state_kinds().size() * offload::NvmeStore::IoBytes(TileElems(*this, u, t) * 4);
  }
  STRATA_RETURN_IF_ERROR(CreateIoQueue());
  STRATA_ASSIGN_OR_RETURN(nvme,
                          offload::NvmeStore::Create(StoreOptions(*this, path, "optimizer", need), io_queue.get()));
  STRATA_ASSIGN_OR_RETURN(staging, offload::PinnedPool::Create(PoolOptions(*this, NvmeStagingTiles(cfg), nvme_tile_elems * 4,
                                                                           memory::Kind::kScratch,
                                                                           cfg.offload_optimizer.pin_memory),
                                                               host_alloc.get()));
  io_queue->RegisterBuffers(staging->buffers()).IgnoreError();  // a hint; fine without
  for (UnitState& u : units) {
    u.nvme_lanes.assign(state_kinds().size(), {});
    for (optim::StateKind k : state_kinds()) {
      const memory::Kind kind = k == optim::StateKind::kMaster ? memory::Kind::kMaster : memory::Kind::kOptimizerState;
      for (size_t t = 0; t < Tiles(*this, u); ++t) {
        STRATA_ASSIGN_OR_RETURN(offload::NvmeExtent e, nvme->Allocate(TileElems(*this, u, t) * 4, kind));
        u.nvme_lanes[optim::StateIndex(k)].push_back(std::move(e));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Engine::Impl::ReadState(UnitState& u, optim::StateKind kind) {
  std::vector<float> out(update_elems(u));
  if (!nvme_optimizer()) {
    STRATA_RETURN_IF_ERROR(StateOps(kind).ToHost(out.data(), StatePtr(u, kind), out.size() * 4));
    return out;
  }
  offload::PinnedBuffer buf = staging->Acquire();
  const auto& lane = u.nvme_lanes[optim::StateIndex(kind)];
  for (size_t t = 0; t < lane.size(); ++t) {
    const size_t n = TileElems(*this, u, t);
    STRATA_RETURN_IF_ERROR(nvme->Read(lane[t], buf.view()).Wait());
    std::memcpy(out.data() + t * nvme_tile_elems, buf.data(), n * 4);
  }
  return out;
}

absl::Status Engine::Impl::WriteState(UnitState& u, optim::StateKind kind, const std::vector<float>& values) {
  if (!nvme_optimizer()) return StateOps(kind).FromHost(StatePtr(u, kind), values.data(), values.size() * 4);
  offload::PinnedBuffer buf = staging->Acquire();
  const auto& lane = u.nvme_lanes[optim::StateIndex(kind)];
  for (size_t t = 0; t < lane.size(); ++t) {
    const size_t n = TileElems(*this, u, t);
    std::memcpy(buf.data(), values.data() + t * nvme_tile_elems, n * 4);
    STRATA_RETURN_IF_ERROR(nvme->Write(lane[t], buf.view()).Wait());
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::EditState(UnitState& u, optim::StateKind kind, const std::function<void(float*)>& fn,
                                     bool write_back) {
  if (!nvme_optimizer() && StateOps(kind).host_visible()) {
    fn(StatePtr(u, kind));
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<float> staged, ReadState(u, kind));
  fn(staged.data());
  return write_back ? WriteState(u, kind, staged) : absl::OkStatus();
}

absl::Status Engine::Impl::NvmeUpdate(UnitState& u, double lr, float clip_coef) {
  std::vector<offload::TileLane> tiles(u.nvme_lanes.size());  // in optim::StateIndex order
  for (size_t l = 0; l < tiles.size(); ++l) {
    for (const offload::NvmeExtent& e : u.nvme_lanes[l]) tiles[l].tiles.push_back(&e);
  }
  const float* grad = GradUpdatePtr(u);
  return UpdateParamStorage(u, [&](char* params) -> absl::Status {
    auto fn = [&](size_t t, absl::Span<const memory::BufferView> v) -> absl::Status {
      const size_t lo = t * nvme_tile_elems, hi = lo + TileElems(*this, u, t);
      std::vector<shard::Segment> segs;
      for (const shard::Segment& s : u.update_segments) {
        const size_t b = std::max(lo, s.begin), e = std::min(hi, s.end);
        if (b < e) segs.push_back({b - lo, e - lo, s.param, s.weight_decay});
      }
      optim::ShardState st{v[0].as<float>(), grad + lo, v[1].as<float>(), v.size() > 2 ? v[2].as<float>() : nullptr};
      optim::UpdateOptions opts;
      opts.executor = host_executor.get();  // same bits for every thread count
      char* dst = params + lo * param_bytes();
      if (cfg.param_dtype != DType::kF32) {
        opts.param_copy = reinterpret_cast<uint16_t*>(dst);
        opts.param_copy_dtype = cfg.param_dtype;
      }
      optim::ApplyUpdate(cfg.optimizer, st, segs, lr, step + 1, clip_coef, opts);
      if (cfg.param_dtype == DType::kF32) std::memcpy(dst, v[0].data, (hi - lo) * 4);
      return absl::OkStatus();
    };
    STRATA_ASSIGN_OR_RETURN(offload::TilePipelineStats stats, offload::RunTiledPipeline(*nvme, *staging, tiles, fn));
    exposed_io_ns += stats.read_wait_ns + stats.write_wait_ns;
    nvme_read_bytes += stats.bytes_read;
    nvme_write_bytes += stats.bytes_written;
    return absl::OkStatus();
  });  // the tiles cover the whole update range
}

}  // namespace strata::engine
