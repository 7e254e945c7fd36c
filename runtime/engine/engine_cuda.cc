// The engine on a CUDA device (Note [Engine on CUDA] in engine_impl.h): the device tier as one cudaMalloc
// arena, the kernels/cuda tier ops, NCCL communicators per stream bootstrapped over the host world, and a
// host communicator for the small control collectives. Built only with STRATA_WITH_CUDA; every CUDA and
// NCCL object comes from the CUDA back-end module (runtime/base/module.h), so this file links neither.
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/nccl_backend.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/memory/cuda_backend.h"

namespace strata::engine {

absl::Status EngineRuntime::SetUpCuda(const EngineConfig& cfg, comm::Communicator& host_world) {
  if (cfg.offload_param.device != OffloadDevice::kNone && cfg.offload_optimizer.device == OffloadDevice::kNone) {
    return absl::UnimplementedError(
        "offload_param on a CUDA device needs offload_optimizer (cpu or nvme) too: the update runs where the "
        "fp32 master lives and writes the parameter shard there, so both must be off the GPU");
  }
  if (cfg.offload_optimizer.device != OffloadDevice::kNone && cfg.stage < 2) {
    return absl::UnimplementedError(absl::StrCat(
        "offload_optimizer on a CUDA device needs stage 2 or 3 (stage is ", cfg.stage,
        "): gradients are reduced on the GPU into a shard and copied to the host"));
  }
#if STRATA_WITH_NCCL
  STRATA_ASSIGN_OR_RETURN(const comm::NcclApi* nccl, comm::NcclBackend());
  STRATA_ASSIGN_OR_RETURN(const memory::CudaMemoryApi* cuda_memory, memory::CudaMemoryBackend());
  STRATA_ASSIGN_OR_RETURN(device_ops, memory::MakeCudaTierOps(*device));
  STRATA_ASSIGN_OR_RETURN(device_update, optim::MakeCudaTierUpdate(*device));
  // Offloaded state is registered host memory, so the copies to and from the GPU are asynchronous DMA.
  host_alloc = cuda_memory->create_host_allocator(cfg.host_budget_bytes, &tracker);
  control_host_stream = std::make_unique<device::HostStream>("control");
  control_stream = control_host_stream.get();
  const int64_t t = cfg.collective_timeout_ms;
  std::unique_ptr<comm::Communicator> nccl_world;
  if (host_world.device_buffers()) {  // an embedder's NCCL communicator (C ABI): control through a bounce
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c, host_world.Dup("control", t));
    STRATA_ASSIGN_OR_RETURN(control_comm, nccl->host_buffers_over_nccl(std::move(c)));
    STRATA_ASSIGN_OR_RETURN(nccl_world, host_world.Dup("gather", t));
  } else {  // a host world (MPI, in-process): NCCL bootstrapped over it
    STRATA_ASSIGN_OR_RETURN(control_comm, host_world.Dup("control", t));
    comm::Options o;
    o.timeout_ms = t;
    o.name = "gather";
    STRATA_ASSIGN_OR_RETURN(nccl_world, nccl->create_from_host(*control_comm, *control_stream, o));
  }
  control = control_comm.get();
  if (groups.replicas == 1) {  // the world's NCCL communicator gathers, as before hybrid sharding
    gather_comm = std::move(nccl_world);
    STRATA_ASSIGN_OR_RETURN(reduce_comm, gather_comm->Dup("reduce", t));
    STRATA_ASSIGN_OR_RETURN(step_comm, gather_comm->Dup("step", t));
    shard_rank = step_comm->rank();
  } else {  // the groups are split off the world's NCCL communicator (ncclCommSplit), which every rank then frees
    STRATA_RETURN_IF_ERROR(SplitStreamComms(cfg, *nccl_world));
  }
  return SetUpGroupControl(cfg);
#else
  (void)host_world;
  return absl::UnimplementedError("this CUDA build has no NCCL: the engine cannot run on the GPU");
#endif
}

absl::Status EngineRuntime::CreateDeviceArena(const EngineConfig& cfg, uint64_t need) {
  if (device->kind() != device::DeviceKind::kCuda) return absl::OkStatus();
  // Without a budget the arena is what this model needs, plus room for each block's alignment; the rest
  // of the GPU stays free for the trainer's activations and workspaces.
  const uint64_t bytes = cfg.device_budget_bytes != memory::kUnlimited ? cfg.device_budget_bytes
                                                                       : need + need / 100 + (uint64_t{4} << 20);
  STRATA_ASSIGN_OR_RETURN(const memory::CudaMemoryApi* cuda_memory, memory::CudaMemoryBackend());
  STRATA_ASSIGN_OR_RETURN(device_alloc, cuda_memory->create_arena(bytes, &tracker));
  return absl::OkStatus();
}

}  // namespace strata::engine
