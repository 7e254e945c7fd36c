// What the engine runs on (EngineRuntime): the world and the device, the communicators and streams of the
// phases, the memory tiers and their operations, the host optimizer threads and the offload I/O queue. Not
// a public header: the engine's own files include it through engine_impl.h.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/shard_groups.h"
#include "runtime/device/device.h"
#include "runtime/engine/config.h"
#include "runtime/memory/memory.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/offload/io_queue.h"
#include "runtime/optim/host_executor.h"
#include "runtime/optim/tier_update.h"

namespace strata::engine {

// engine_groups.cc: the shard groups zero_optimization.shard_group_size asks for (collective over world
// for "node").
absl::StatusOr<comm::GroupSplit> ResolveShardGroups(const EngineConfig& cfg, comm::Communicator& world,
                                                    device::Stream& stream);

// What the engine runs on: the world and the device, the communicator and stream of each phase, the
// memory tiers with their accountant and their operations, the host optimizer threads and the offload
// I/O queue. Made in Create (SetUpCuda on CUDA) and Finalize, fixed afterwards; Engine::Impl's first
// member, so it outlives every buffer, store and pool the engine holds. Its set-up functions below are
// the only ones that write it.
struct EngineRuntime {
  comm::Communicator* world = nullptr;
  device::Device* device = nullptr;
  std::unique_ptr<comm::Communicator> gather_comm, reduce_comm, step_comm;
  // Hybrid sharding (engine_groups.cc says which communicator spans what): the shard groups, decided at
  // Create; the replica all-reduce on the reduce stream (stages 2-3 with replicas; else null); this
  // rank's place in its shard group, which the layouts, extents and gathers use.
  comm::GroupSplit groups;
  std::unique_ptr<comm::Communicator> replica_comm;
  int shard_rank = 0;
  int shard_size() const { return groups.group_size; }
  std::unique_ptr<device::Stream> gather_stream, reduce_stream, step_stream;
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Allocator> device_alloc;
  std::unique_ptr<memory::Allocator> host_alloc;  // the pinned-host tier (offloaded state), host budget
  // Where host-memory optimizer updates run (the host tier's update and the NVMe tiles read this slot): a
  // pool of strata.optimizer_threads threads, or empty for one thread; host_threads is its kernels and
  // pool as the host tier's casts read them (SetOptimizerThreads sets both). Declared before the ops that
  // point at them.
  std::unique_ptr<optim::HostExecutor> host_executor;
  memory::HostThreads host_threads;
  // Note [Tier ops] (runtime/memory/tier_ops.h): the operations on buffer contents, per tier, and the
  // optimizer's update over each (optim/tier_update.h). The device tier's are the host ones on host
  // devices (the device tier is host memory there) and the CUDA ones on CUDA devices. The engine hands
  // them to shard/ and optim/, which call them directly.
  std::unique_ptr<memory::TierOps> device_ops, host_ops;
  std::unique_ptr<optim::TierUpdate> device_update, host_update;
  memory::TierOps& OpsOf(const memory::Allocator& a) const {
    return a.tier() == memory::Tier::kDevice ? *device_ops : *host_ops;
  }
  optim::TierUpdate& UpdateOf(const memory::Allocator& a) const {
    return a.tier() == memory::Tier::kDevice ? *device_update : *host_update;
  }
  // Small collectives on host buffers (registration check, the gradient norm, checkpoint reports, exports):
  // step_comm on host devices; on CUDA devices a host communicator beside the NCCL ones.
  comm::Communicator* control = nullptr;
  device::Stream* control_stream = nullptr;
  std::unique_ptr<comm::Communicator> control_comm;
  std::unique_ptr<device::Stream> control_host_stream;
  // Control collectives within the shard group, on control_stream (the gradient norm, GatherUnit):
  // control itself without replicas.
  comm::Communicator* group_control = nullptr;
  std::unique_ptr<comm::Communicator> group_control_comm;
  std::unique_ptr<offload::IoQueue> io_queue;  // the NVMe stores' (CreateIoQueue, on first use)

  int rank() const { return world->rank(); }
  int world_size() const { return world->size(); }
  // The host optimizer pool (engine_step.cc): `threads` as strata.optimizer_threads says it (0: the
  // default, OptimizerThreads(cfg)).
  absl::Status SetOptimizerThreads(const EngineConfig& cfg, int threads);
  // Note [Engine on CUDA] (engine_impl.h). engine_cuda.cc: the CUDA tiers and the NCCL communicators; the
  // device arena at Finalize (a no-op on host devices).
  absl::Status SetUpCuda(const EngineConfig& cfg, comm::Communicator& host_world);
  absl::Status CreateDeviceArena(const EngineConfig& cfg, uint64_t need);
  // engine_groups.cc: the gather, reduce, replica and step communicators over `base` (the host world, or
  // the world's NCCL communicator), the host ones with control, and group_control after control.
  absl::Status SplitStreamComms(const EngineConfig& cfg, comm::Communicator& base);
  absl::Status SetUpHostComms(const EngineConfig& cfg, comm::Communicator& host_world);
  absl::Status SetUpGroupControl(const EngineConfig& cfg);
  absl::Status CreateIoQueue();  // unit_storage.cc; once, on first use
};

}  // namespace strata::engine
