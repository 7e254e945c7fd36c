// `strata plan`'s step time: compute from the model's FLOPs, collectives by alpha-beta, overlapped as
// the engine schedules them (docs/design.md "The shape of one training step"; docs/decisions/0017-strata-plan.md).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/engine/placement.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_units.h"

namespace strata::tools::plan {

namespace {

double Ring(uint64_t bytes, int p, double alpha_s, double bytes_per_s, double moves) {
  if (p <= 1 || bytes == 0) return 0;
  return moves * (p - 1) * alpha_s + moves * (double(p - 1) / p) * double(bytes) / bytes_per_s;
}

// The link a group of `p` ranks uses. Shard groups are consecutive ranks (r / G); replica groups take
// every G-th rank. A group inside one node runs on NVLink / shared memory; one that spans nodes is as
// fast as its slowest hop, the per-GPU rail, which is also the latency it pays.
Link GroupLink(const PlanInput& in, int p, bool consecutive) {
  const int rpn = std::max(1, in.ranks_per_node);
  const bool inside = consecutive ? (p <= rpn && rpn % p == 0) : in.ranks <= rpn;
  Link l = inside ? in.device.intra : in.device.inter;
  if (!inside) {  // the rail bounds the ring; NVLink hops on the way are faster
    l.all_gather_bytes_per_s = std::min(l.all_gather_bytes_per_s, in.device.intra.all_gather_bytes_per_s);
    l.reduce_scatter_bytes_per_s = std::min(l.reduce_scatter_bytes_per_s, in.device.intra.reduce_scatter_bytes_per_s);
    l.all_reduce_bytes_per_s = std::min(l.all_reduce_bytes_per_s, in.device.intra.all_reduce_bytes_per_s);
  }
  const double e = in.link_efficiency;
  l.all_gather_bytes_per_s *= e;
  l.reduce_scatter_bytes_per_s *= e;
  l.all_reduce_bytes_per_s *= e;
  return l;
}

// One use of a unit in the schedule: its compute, the gather it needs, the reduction it issues.
struct Use {
  int unit;
  double compute_s;
  double gather_s;  // 0 when no gather is needed (stages 0-2, or still gathered)
  double reduce_s;  // backward only: the reduction issued after its last use in the micro-batch
};

// Forward: every use of a unit overlaps its compute with the gather of the next use (prefetch); the
// first gather is exposed. Backward the same, and the reduction of the previous use shares the link
// with the next gather (two streams, one wire). Returns (elapsed, exposed communication).
//
// `cores_per_rank` (0: enough) bounds the overlap where the collectives are CPU work (hosts: MPI over shared
// memory copies and reduces on the ranks' own cores, and polls while it waits): in the time of one use a
// rank's compute and its communication need compute + comm seconds of CPU, and R ranks have R x
// cores_per_rank cores, so the use takes at least (compute + comm) / cores_per_rank. Both rates were
// measured with R ranks busy at once, so under one core per rank (where they already share cores) the bound
// is compute + comm. With two or more cores per rank it is below the max and the overlap is as before.
std::pair<double, double> Pipeline(const std::vector<Use>& uses, int prefetch, double cores_per_rank) {
  const double share = cores_per_rank > 0 ? 1.0 / std::max(1.0, cores_per_rank) : 0.0;
  double elapsed = 0, exposed = 0;
  if (uses.empty()) return {0, 0};
  elapsed += uses[0].gather_s;
  exposed += uses[0].gather_s;
  for (size_t i = 0; i < uses.size(); ++i) {
    const double next = i + 1 < uses.size() ? uses[i + 1].gather_s : 0;
    const double prev_reduce = i > 0 ? uses[i - 1].reduce_s : 0;
    const double comm = next + prev_reduce;
    const double overlapped = std::max({uses[i].compute_s, comm, (uses[i].compute_s + comm) * share});
    const double busy = prefetch > 0 ? overlapped : uses[i].compute_s + comm;
    elapsed += busy;
    exposed += busy - uses[i].compute_s;
  }
  elapsed += uses.back().reduce_s;  // the last reduction drains before the step
  exposed += uses.back().reduce_s;
  return {elapsed, exposed};
}

}  // namespace

double AllGatherSeconds(uint64_t bytes, int p, const Link& link) {
  return Ring(bytes, p, link.alpha_s, link.all_gather_bytes_per_s, 1);
}
double ReduceScatterSeconds(uint64_t bytes, int p, const Link& link) {
  return Ring(bytes, p, link.alpha_s, link.reduce_scatter_bytes_per_s, 1);
}
double AllReduceSeconds(uint64_t bytes, int p, const Link& link) {
  return Ring(bytes, p, link.alpha_s, link.all_reduce_bytes_per_s, 2);
}

absl::StatusOr<TimePlan> PlanTime(const PlanInput& in) {
  STRATA_ASSIGN_OR_RETURN(std::vector<shard::UnitLayout> layouts, Layouts(in));
  const engine::EngineConfig& c = in.engine;
  const int G = ShardGroup(in), R = in.ranks / G, stage = c.stage;
  const int M = c.gradient_accumulation_steps;
  const double tokens = double(c.train_micro_batch_size_per_gpu) * in.model->SequenceLength();  // per micro-batch
  const double pb = DTypeBytes(c.param_dtype);
  const Link shard_link = GroupLink(in, G, true), replica_link = GroupLink(in, R, false);
  const Link world_link = GroupLink(in, in.ranks, true);
  const double rate = in.device.matmul_flops * in.compute_efficiency;
  // The model's own uses of its units in a micro-batch, with their FLOPs.
  const spec::StepUses uses = in.model->Uses(c.train_micro_batch_size_per_gpu);
  for (const std::vector<spec::UnitUse>* pass : {&uses.forward, &uses.backward}) {
    for (const spec::UnitUse& u : *pass) {
      if (u.unit < 0 || u.unit >= static_cast<int>(layouts.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("the model's schedule (ModelSpec::Uses) names unit ", u.unit, "; it has ", layouts.size()));
      }
    }
  }
  // Offloaded parameters reach the gather through the host: a copy (GPU) or an NVMe read first.
  const bool nvme_params = c.offload_param.device == engine::OffloadDevice::kNvme;
  const bool cpu_params = c.offload_param.device == engine::OffloadDevice::kCpu;
  auto gather = [&](int u) {
    if (stage != 3) return 0.0;
    const uint64_t shard_bytes = uint64_t(layouts[u].shard_elems * pb);
    double s = AllGatherSeconds(uint64_t(layouts[u].total_elems * pb), G, shard_link);
    if (nvme_params && in.device.nvme_bytes_per_s > 0) s += shard_bytes / in.device.nvme_bytes_per_s;
    if ((cpu_params || nvme_params) && in.device.gpu) s += shard_bytes / in.device.h2d_bytes_per_s;
    return s;
  };
  // Stages 2-3 reduce-scatter in the group every micro-batch; stages 0-1 all-reduce the full gradient on
  // the last one. Across replica groups the shard is all-reduced on the last micro-batch.
  auto reduce = [&](int u, bool last) {
    const uint64_t full = layouts[u].total_elems * 4, shard = layouts[u].shard_elems * 4;
    if (stage <= 1) return last ? AllReduceSeconds(full, in.ranks, world_link) : 0.0;
    double s = ReduceScatterSeconds(full, G, shard_link);
    if (last) s += AllReduceSeconds(shard, R, replica_link);
    return s;
  };
  const double bwd_factor = 2.0;  // backward = two products per forward product
  const double cores_per_rank = !in.device.gpu && in.device.cores_per_node > 0
                                    ? double(in.device.cores_per_node) / std::max(1, in.ranks_per_node)
                                    : 0.0;
  TimePlan t;
  for (int mb = 0; mb < M; ++mb) {
    const bool last = mb == M - 1;
    // In the trainer's order (for the GPT: the embeddings, the blocks, the final LayerNorm, the head, which
    // is the tied embeddings), every use gathers its unit at stage 3.
    std::vector<Use> fwd, bwd;
    for (const spec::UnitUse& u : uses.forward) fwd.push_back({u.unit, u.flops / rate, gather(u.unit), 0});
    const double recompute = in.checkpointing ? 1.0 : 0.0;
    // A unit released after its forward (reshard after forward) is gathered again for its backward; the
    // GPT's head's forward released the embeddings and the prefetch found them still gathered, so the head's
    // backward gathers them again on demand: exposed, as the first of the pass. Without resharding after
    // forward (strata.reshard_after_forward = false) every unit stays gathered.
    auto regather = [&](int u) { return c.reshard_after_forward ? gather(u) : 0.0; };
    for (const spec::UnitUse& u : uses.backward) {
      const double factor = bwd_factor + (u.recomputed ? recompute : 0.0);
      bwd.push_back({u.unit, factor * u.flops / rate, regather(u.unit), u.reduces ? reduce(u.unit, last) : 0.0});
    }
    for (const std::vector<Use>* pass : {&fwd, &bwd}) {
      const auto [elapsed, exposed] = Pipeline(*pass, c.prefetch_depth, cores_per_rank);
      t.exposed_comm_s += exposed;
      for (const Use& u : *pass) {
        t.compute_s += u.compute_s;
        t.gather_s += u.gather_s;
        t.reduce_s += u.reduce_s;
      }
      (void)elapsed;
    }
  }
  // The update streams master, m, v (read and written), the gradient (read) and the params (written).
  uint64_t update_elems = 0, replicate_bytes = 0;
  for (const shard::UnitLayout& l : layouts) {
    update_elems += engine::DecideExtents(stage, 0, l).update_elems;
    replicate_bytes += uint64_t(l.total_elems * pb);
  }
  const bool host_update = c.offload_optimizer.device != engine::OffloadDevice::kNone || !in.device.gpu;
  const double update_bw = host_update ? in.device.host_memory_bytes_per_s : in.device.memory_bytes_per_s;
  if (update_bw > 0) t.optimizer_s = (24.0 + 4.0 + pb) * update_elems / update_bw;
  if (stage == 1 || stage == 2) {  // the updated slices are all-gathered into every rank's params
    const double s = AllGatherSeconds(replicate_bytes, G, shard_link);
    t.optimizer_s += s;
    t.gather_s += s;
  }
  // Offload I/O: the NVMe optimizer streams three fp32 lanes in and out, pipelined under the update; on a
  // GPU the updated params go back to the device over PCIe.
  if (c.offload_optimizer.device == engine::OffloadDevice::kNvme && in.device.nvme_bytes_per_s > 0) {
    const double io = 2.0 * 12.0 * update_elems / in.device.nvme_bytes_per_s;
    t.io_s += std::max(0.0, io - t.optimizer_s);
  }
  if (c.offload_optimizer.device != engine::OffloadDevice::kNone && in.device.gpu && in.device.h2d_bytes_per_s > 0) {
    t.io_s += update_elems * pb / in.device.h2d_bytes_per_s;
  }
  t.step_s = t.compute_s + t.exposed_comm_s + t.optimizer_s + t.io_s;
  t.tokens_per_s = t.step_s > 0 ? tokens * M * in.ranks / t.step_s : 0;
  // MFU counts the model's FLOPs (forward and backward, 3x forward), not the recomputation (PaLM's definition,
  // what torchtitan and the Llama reports quote).
  const double model_flops = 3.0 * in.model->ForwardFlopsPerToken() * tokens * M;
  t.mfu = t.step_s > 0 && in.device.matmul_flops > 0 ? model_flops / (t.step_s * in.device.matmul_flops) : 0;
  return t;
}

}  // namespace strata::tools::plan
