// Note [Placement]. Where each of a unit's buffers lives and which elements of the unit a rank holds in
// each follow from the ZeRO stage and the offload settings alone. They are decided here, once per run
// (DecidePlacement, at Create) and once per unit (DecideExtents, at RegisterUnit), so the engine's
// functions read the decision instead of testing the stage and the offload devices again (issue 16:
// no engine function branches on stage or placement more than once). The storage table per stage is
// in engine_impl.h.
//
// Note [Tier placement] (DeepSpeed's offload_param / offload_optimizer semantics): parameter shards
// live on the device unless offload_param says cpu; with offload_optimizer the fp32 master, the fp32
// gradient shard and Adam's m, v live on the host tier and the update runs there. The master is a
// separate buffer whenever it cannot be the parameter storage itself (low-precision params, or the
// optimizer offloaded away from the parameters). Gathered and working buffers stay on the device.
//
// Note [Frozen units]. A unit whose parameters are frozen (shard::ParamSpec::frozen; RegisterUnit refuses a
// unit that mixes frozen and trainable ones) holds only its params (DecideExtents below), placed, sharded and
// gathered as a trainable unit's: no grads, no master, no optimizer state, no working gradient buffer. Its
// backward uses gather the params (the trainer still computes input gradients with them) but Grad() is
// nullptr and EndBackward reduces nothing; the step skips it (no norm term, no update, nothing to
// re-replicate at stages 1-2). Its update range is the range the rank owns, never updated: its StateOwner's
// Read / Write of kMaster read and write the param storage there (FrozenState, unit_storage.cc),
// converted to and from fp32 (exact for bf16 and fp16), so checkpoints, export, GatherUnit and SetParam treat
// it as a master that has no optimizer state. Checkpoints save only its master kind and mark its parameters
// frozen (checkpoint/manifest.h).
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/engine/config.h"
#include "runtime/memory/memory.h"
#include "runtime/shard/layout.h"

namespace strata::engine {

// The tier of each kind of a unit's buffers. nullptr where the kind has no buffer in memory: params with
// offload_param = nvme (the shard cache holds them, Note [NVMe params]); master when it is the param
// storage itself or lives on NVMe; state (m, v) on NVMe (Note [NVMe state]).
struct Placement {
  memory::Allocator* params = nullptr;
  memory::Allocator* master = nullptr;
  memory::Allocator* grads = nullptr;  // the optimizer's tier (where the update reads the reduced gradient)
  // Each unit keeps a gradient shard on `grads`; not with strata.optimizer_in_backward, whose update reads
  // the reduction's scratch (Note [Optimizer in backward], runtime/engine/engine_owners.cc).
  bool grad_shards = true;
  memory::Allocator* state = nullptr;
  // The master is not the param storage itself (low-precision params, or the optimizer offloaded away
  // from the parameters): in `master` or on NVMe.
  bool master_apart = false;
};

// `device` and `host` are the device and pinned-host tiers.
Placement DecidePlacement(const EngineConfig& cfg, memory::Allocator* device, memory::Allocator* host);

// The elements [begin, begin + elems) of a unit that each of its buffers holds on one rank.
// A frozen unit (Note [Frozen units] above) has no gradients and no update: grad_elems is 0 and
// update_segments is empty, but its update range is still the range the rank owns (saves, restores,
// gathers for export), exactly where a trainable unit's would be.
struct UnitExtents {
  size_t param_begin = 0, param_elems = 0;    // the param storage: the rank's shard at stage 3, else the unit
  size_t grad_begin = 0, grad_elems = 0;      // the gradients: the shard at stages 2-3
  size_t update_begin = 0, update_elems = 0;  // what the rank's optimizer updates: the shard at stages 1-3
  std::vector<shard::Segment> update_segments;  // the parameter runs of the update range, relative to its start
  bool frozen = false;  // no grads, no master apart from the params, no optimizer state
};

UnitExtents DecideExtents(int stage, int rank, const shard::UnitLayout& layout);  // frozen: layout.frozen()

// The sizes of the engine-wide buffers beside the units' own, whether the run has them or not.
struct SharedSizes {
  uint64_t nvme_staging = 0;        // the tiled update's pinned tiles (Note [NVMe state])
  uint64_t nvme_param_buffers = 0;  // the parameter shard cache's pinned buffers (Note [NVMe params])
  uint64_t gathered = 0;            // the gatherer's slot pool (stage 3)
  uint64_t grad_buffers = 0;        // the reduce-scatter's working pool and scratch (stages 2-3)
  uint64_t grad_staging = 0;        // the reducer's pinned staging; 0 where it is not needed
};

// One engine-wide buffer the run has: its tier, its size, its name in the budget check's message and
// whether the check names it before the units' buffers.
struct SharedBuffer {
  memory::Allocator* tier;
  uint64_t bytes;
  const char* what;
  bool before_units;
};

// The engine-wide buffers this run has, in the order the budget check names them.
std::vector<SharedBuffer> SharedBuffers(const EngineConfig& cfg, const SharedSizes& bytes, memory::Allocator* device,
                                        memory::Allocator* host);

}  // namespace strata::engine
