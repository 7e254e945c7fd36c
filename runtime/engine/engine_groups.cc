// Hybrid sharding in the engine (docs/design.md "Hybrid sharding", Note [Shard groups] in comm/shard_groups.h):
// the shard groups are decided and the per-stream communicators split once, at Create.
//
// Which communicator spans what, with G ranks per shard group and R = N / G replicas:
//   gather   the shard group (stage 3's all-gathers)
//   reduce   stages 2-3: the shard group (reduce-scatter); stage 1: the world (all-reduce of full gradients)
//   replica  stages 2-3 with R > 1: the replica group, on the reduce stream (all-reduce of reduced shards)
//   step     the shard group (stages 1-2 re-replicate the updated slices)
//   control  the world (registration check, checkpoint reports); group_control: the shard group (the
//            gradient norm: replicas hold identical shards, so the group's sum is the global norm; GatherUnit)
// With R = 1 (the default) the communicators are Dups of the world, exactly as before hybrid sharding.
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/bootstrap.h"
#include "runtime/engine/engine_impl.h"

namespace strata::engine {

// Note [Nodes under torchrun]. torchrun says which ranks share a node: its agent starts LOCAL_WORLD_SIZE ranks per
// node and numbers them from the node's first global rank, RANK - LOCAL_RANK. That is the node for
// shard_group_size "node" when the engine's world is torchrun's (the same rank and size), so that torchrun's
// nodes decide, not the host names: two torchrun "nodes" on one host (tests, or a node's GPUs split between two
// agents) are two nodes. Anything else (MPI, a process group that is not torchrun's world) uses the host name.
namespace {

std::string TorchrunNode(const comm::Communicator& world) {
  absl::StatusOr<comm::TorchrunEnv> t = comm::TorchrunLaunch();
  if (!t.ok() || t->local_world_size == 0 || t->world_size != world.size() || t->rank != world.rank()) return "";
  return absl::StrCat("torchrun node of ranks ", t->rank - t->local_rank, "..",
                      t->rank - t->local_rank + t->local_world_size - 1);
}

}  // namespace

absl::StatusOr<comm::GroupSplit> ResolveShardGroups(const EngineConfig& cfg, comm::Communicator& world,
                                                    device::Stream& stream) {
  const char* key = "config key 'zero_optimization.shard_group_size'";
  if (cfg.shard_group_size == kShardGroupNode) {
    // The host names travel in host memory, which a communicator of device buffers (NCCL) cannot send,
    // and this runs before SetUpCuda has a host communicator beside it.
    if (world.device_buffers()) {
      return absl::FailedPreconditionError(absl::StrCat(
          key, " is \"node\", which compares host names over the world communicator; this one (", world.options().name,
          ") takes device buffers only: give the shard group size as a number (the ranks per node)"));
    }
    // Over a Dup of its own, so that the caller's communicator carries none of the engine's collectives.
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> probe,
                            world.Dup("host-names", cfg.collective_timeout_ms));
    auto by_host = comm::GroupsByHost(*probe, stream, TorchrunNode(world));
    if (!by_host.ok()) return Annotate(by_host.status(), key);
    return by_host;
  }
  const int g = cfg.shard_group_size == kShardGroupWorld ? world.size() : cfg.shard_group_size;
  auto contiguous = comm::ContiguousGroups(world.size(), world.rank(), g);
  if (!contiguous.ok()) return Annotate(contiguous.status(), key);
  return contiguous;
}

absl::Status EngineRuntime::SplitStreamComms(const EngineConfig& cfg, comm::Communicator& base) {
  const int64_t t = cfg.collective_timeout_ms;
  auto shard = [&](const char* name) { return base.Split(groups.shard_color, groups.shard_key, name, t); };
  if (groups.replicas == 1) {
    STRATA_ASSIGN_OR_RETURN(gather_comm, base.Dup("gather", t));
    STRATA_ASSIGN_OR_RETURN(reduce_comm, base.Dup("reduce", t));
    STRATA_ASSIGN_OR_RETURN(step_comm, base.Dup("step", t));
  } else {
    STRATA_ASSIGN_OR_RETURN(gather_comm, shard("gather"));
    if (cfg.stage <= 1) {
      STRATA_ASSIGN_OR_RETURN(reduce_comm, base.Dup("reduce", t));
    } else {
      STRATA_ASSIGN_OR_RETURN(reduce_comm, shard("reduce"));
      STRATA_ASSIGN_OR_RETURN(replica_comm, base.Split(groups.replica_color, groups.replica_key, "replica", t));
    }
    STRATA_ASSIGN_OR_RETURN(step_comm, shard("step"));
  }
  shard_rank = step_comm->rank();
  return absl::OkStatus();
}

absl::Status EngineRuntime::SetUpGroupControl(const EngineConfig& cfg) {
  if (groups.replicas == 1) {
    group_control = control;
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(group_control_comm, control->Split(groups.shard_color, groups.shard_key, "group-control",
                                                             cfg.collective_timeout_ms));
  group_control = group_control_comm.get();
  return absl::OkStatus();
}

absl::Status EngineRuntime::SetUpHostComms(const EngineConfig& cfg, comm::Communicator& host_world) {
  STRATA_RETURN_IF_ERROR(SplitStreamComms(cfg, host_world));
  control_stream = step_stream.get();
  if (groups.replicas == 1) {
    control = step_comm.get();
  } else {  // the step communicator spans only the shard group
    STRATA_ASSIGN_OR_RETURN(control_comm, host_world.Dup("control", cfg.collective_timeout_ms));
    control = control_comm.get();
  }
  return SetUpGroupControl(cfg);
}

int Engine::shard_group_size() const { return impl_->rt.shard_size(); }
int Engine::shard_rank() const { return impl_->rt.shard_rank; }

CommTraffic Engine::comm_traffic() const {
  const Impl& m = *impl_;
  auto of = [](const std::unique_ptr<comm::Communicator>& c) { return c ? c->traffic() : comm::Traffic{}; };
  return CommTraffic{of(m.rt.gather_comm), of(m.rt.reduce_comm),  of(m.rt.replica_comm),
                     of(m.rt.step_comm),   of(m.rt.control_comm), of(m.rt.group_control_comm)};
}

}  // namespace strata::engine
