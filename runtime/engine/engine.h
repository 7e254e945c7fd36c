// The engine facade: a trainer registers units, then drives each step through per-unit hooks.
//
// Protocol (every rank, same order):
//   RegisterUnit(...) for every unit; Finalize()                       // collective: checks registrations
//   per step:  for each of gradient_accumulation_steps micro-batches:
//                BeginMicroBatch()
//                BeginForward(u) ... use Param(u, i) ... EndForward(u)     // per use of a unit
//                BeginBackward(u) ... read Param, add into Grad(u, i) ... EndBackward(u)
//                EndMicroBatch()
//              Step()                                                       // collective
// Forward uses outside a micro-batch are evaluation: parameters are gathered on demand, nothing is
// recorded and no backward may follow.
//
// Guarantees. Param(u, i) is valid between Begin* and End* of u; Grad(u, i) between BeginBackward and
// EndBackward, zero at a unit's first backward use in a micro-batch (stages 2-3) or step (0-1); the
// trainer adds (+=) its gradient, which makes tied units (used more than once) correct. Gradients are
// averaged over ranks and micro-batches by the engine: give each micro-batch's mean-loss gradient.
// The first micro-batch's order of uses is recorded; later ones must repeat it (schedule.h), which is
// what makes prefetch possible. Every error is a Status; none hangs: collectives carry timeouts.
//
// Threading: all hooks are called from one thread (the trainer's). Internally the engine runs
// gathers on a gather stream and reductions on a reduce stream, each with its own communicator.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/device/timeline.h"
#include "runtime/engine/config.h"
#include "runtime/memory/memory.h"
#include "runtime/shard/layout.h"

namespace strata::checkpoint {
class AsyncSaver;  // runtime/checkpoint/async_save.h
}  // namespace strata::checkpoint

namespace strata::engine {

struct ParamView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  size_t numel = 0;
  const std::vector<int64_t>* shape = nullptr;
  float* f32() const { return dtype == DType::kF32 ? static_cast<float*>(data) : nullptr; }
};

struct StepResult {
  int64_t step = 0;        // updates applied so far (after this call)
  bool skipped = false;    // non-finite gradients: nothing was updated
  double grad_norm = 0;    // global norm before clipping
  float clip_coef = 1;
  double lr = 0;
  float loss_scale = 1;    // the scale the next micro-batches should use (fp16), after this step's update
  // Where this step's time went, from the engine's view (since the previous Step() returned):
  double compute_ms = 0;        // between Begin* and End* of units (the trainer's compute)
  double exposed_comm_ms = 0;   // the trainer's thread waiting on collectives (gathers, reductions, step)
  double exposed_io_ms = 0;     // the trainer's thread waiting on offload I/O
  double optimizer_ms = 0;      // the update itself (norm, clip, optimizer, casts)
  // NVMe traffic since the previous Step() returned: parameter shards (offload_param = nvme, reads
  // not served from the cache) and the tiled optimizer update (offload_optimizer = nvme).
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
};

// Note [Traffic] (comm/communicator.h): the payload each of the engine's communicators issued so far.
// control and group_control count only when they are communicators of their own (else their
// collectives are step's: on the host without replicas, control is the step communicator).
struct CommTraffic {
  comm::Traffic gather, reduce, replica, step, control, group_control;
};

struct MemoryStats {
  memory::Usage tier[memory::kNumTiers];
  memory::Usage kind[memory::kNumTiers][memory::kNumKinds];
};

class Engine {
 public:
  // Duplicates `world` into one communicator per internal stream (collective). `world` and `device`
  // must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config, comm::Communicator& world,
                                                        device::Device& device);
  ~Engine();

  // Registration (before Finalize). Returns the unit id (0, 1, ... in order).
  absl::StatusOr<int> RegisterUnit(std::string name, std::vector<shard::ParamSpec> params);
  // Collective. Checks every rank registered the same units, allocates state and initialises it.
  absl::Status Finalize();

  // The caller failed on this rank alone, outside the engine (its data, its output files): the peers that
  // wait in one of the engine's collectives end at once with an error naming this rank and `cause`
  // (Note [Failure notices]), and this engine refuses further calls.
  void NotifyFailure(const absl::Status& cause);

  absl::Status BeginMicroBatch();
  absl::Status EndMicroBatch();
  absl::Status BeginForward(int unit);
  absl::Status EndForward(int unit);
  absl::Status BeginBackward(int unit);
  absl::Status EndBackward(int unit);
  // Inside a micro-batch: this rank wrote no gradient to `param` of `unit` in it (torch leaves its .grad
  // None). With strata.params_without_grad "skip", a parameter that no rank wrote a gradient to in any
  // micro-batch of the step is not updated (Note [Parameters without a gradient], engine_step.cc); with
  // "zero" (the default) the mark changes nothing. Idempotent within a micro-batch; a frozen unit's is
  // ignored. A unit with no backward use in the step needs no marks.
  absl::Status MarkNoGrad(int unit, int param);
  absl::StatusOr<StepResult> Step();

  ParamView Param(int unit, int param) const;
  float* Grad(int unit, int param) const;

  // Collective. Writes a sharded checkpoint of the state after the last Step() into `step_dir`: one
  // shard file per rank (master weights and optimizer state over this rank's slice, addressed by global
  // offsets), then the manifest (written last, by rank 0) with the step, loss-scale state, the model's
  // units and `trainer_json` (the trainer's own state). Each file is written to a temporary name,
  // fsynced and renamed; a directory without a manifest is incomplete. Fails if `step_dir` already holds
  // a complete checkpoint. Call between steps only. With hybrid sharding only shard group 0 writes, one
  // file per shard rank (docs/decisions/0016-hybrid-sharding.md).
  absl::Status SaveCheckpoint(const std::string& step_dir, const std::string& trainer_json);
  // Collective. The same checkpoint as SaveCheckpoint, byte for byte, written in the background (Note
  // [Asynchronous checkpoints], runtime/checkpoint/async_save.h): returns once this rank's shard is copied
  // into host memory; a thread writes, fsyncs and publishes it (manifest last) while training goes on.
  // One save in flight: a save (of either kind) or a load first waits for it. Its failure, naming
  // `step_dir`, is returned by the next Step() that finds it finished (that step is then not taken: call
  // Step() again), the next save (which then does not start) or WaitCheckpoint(). The host copy costs
  // this rank's shard of master and optimizer state in host memory until the file is written, except the
  // state on NVMe (offload_optimizer = nvme), which is not copied: the save holds its tiles, and the steps
  // meanwhile write the tiles it holds elsewhere (Note [Snapshots of NVMe state], optim/nvme_state.h).
  absl::Status SaveCheckpointAsync(const std::string& step_dir, const std::string& trainer_json);
  // Collective. Waits for the asynchronous save in flight and returns the last one's outcome (OK if none).
  absl::Status WaitCheckpoint();
  // Whether an asynchronous save is being written (this rank's view; not collective). A save whose NVMe tiles
  // were cloned is still in flight until the next step's reads checked them (decision 0058), at most 2 minutes.
  bool checkpoint_in_flight() const;
  // What the last asynchronous save's snapshot held when it started (zeros before the first): the state it
  // copied into host memory, the NVMe state and frozen parameter shards it held without a copy, the host
  // memory its writer reads those through (one tile or shard at a time), and the frozen units' params it held
  // in place in host memory (Note [Frozen units in a snapshot] in unit_storage.cc), in their dtype.
  struct SnapshotBytes {
    uint64_t host = 0, nvme = 0, staging = 0, in_place = 0;
  };
  SnapshotBytes checkpoint_snapshot_bytes() const;
  // What the last finished asynchronous save's clones of NVMe tiles came to on this rank (Note [Cloned checkpoint
  // lanes] in checkpoint/files.h): tiles cloned, those the steps' reads checked, bytes read back from the file.
  struct CloneCounts {
    uint64_t tiles = 0, checked_by_steps = 0, read_back_bytes = 0;
  };
  CloneCounts checkpoint_clones() const;
  // Collective. Loads a checkpoint written at any world size and stage (resharding by global offsets),
  // verifying every checksum it reads; returns the trainer's state. Errors name the file and the problem:
  // another model, another param dtype or optimizer, a missing shard, a truncated or corrupted file, a
  // manifest from a newer format.
  absl::StatusOr<std::string> LoadCheckpoint(const std::string& step_dir);

  // Collective, blocking: the full fp32 master of a unit (total_elems, padding included), one gather for
  // all its parameters; and of one parameter (a slice of the same gather).
  absl::StatusOr<std::vector<float>> GatherUnit(int unit);
  absl::StatusOr<std::vector<float>> GatherParam(int unit, int param);
  // Collective, blocking: every parameter of every unit (no padding), in registration order, one gather
  // per unit.
  absl::StatusOr<std::vector<float>> GatherAllParams();
  // Overwrites one parameter from a full fp32 value (every rank passes the same data).
  absl::Status SetParam(int unit, int param, const std::vector<float>& value);
  // The elements [first, second) of a unit's flat buffer whose values this rank keeps: the union's cover of
  // its fp32 master (the update range) and its parameter storage. Empty (first == second) when it keeps none.
  std::pair<size_t, size_t> HeldRange(int unit) const;
  // Overwrites elements [offset, offset + count) of one parameter from fp32 values. Elements outside this
  // rank's HeldRange are ignored, so each rank may pass only the part it keeps (a checkpoint read by byte
  // ranges). Not collective.
  absl::Status SetParamRange(int unit, int param, size_t offset, const float* values, size_t count);
  // SetParamRange for several ranges of one unit in one call (docs/decisions/0043-unit-at-once-param-writes.md):
  // the same checks, every range checked before anything is written, and the same result as calling it for
  // each range in order (a later range wins where two overlap), but the unit's master and its parameter
  // storage are each written once. With NVMe offload each write is the whole master / parameter shard, so a
  // loader that writes a unit tensor by tensor moves the unit once, not once per tensor piece (issue #36).
  struct ParamValues {
    int param = 0;
    size_t offset = 0;  // elements [offset, offset + count) of the parameter
    const float* values = nullptr;
    size_t count = 0;
  };
  absl::Status SetParamRanges(int unit, absl::Span<const ParamValues> ranges);
  // Bytes the engine's NVMe stores have moved so far (parameter shards and optimizer state, through its I/O
  // queue: every transfer, step or not); zero without NVMe offload. Waits for the parameter shards' writes in
  // flight first (so they are counted), and returns the first of their errors.
  struct NvmeTraffic {
    uint64_t read_bytes = 0, written_bytes = 0;
  };
  absl::StatusOr<NvmeTraffic> nvme_traffic();

  int num_units() const;
  const shard::UnitLayout& layout(int unit) const;
  const EngineConfig& config() const;
  int rank() const;
  int world_size() const;
  // Hybrid sharding (zero_optimization.shard_group_size, resolved at Create): the ranks of this rank's
  // shard group, which the layouts are sharded over, and this rank's place in it. The world without it.
  int shard_group_size() const;
  int shard_rank() const;
  CommTraffic comm_traffic() const;
  int64_t step() const;
  // The factor the trainer multiplies its loss gradient by (fp16 dynamic loss scaling; 1 otherwise).
  // The engine divides it out of the gradients at Step(); an overflow (non-finite global gradient norm)
  // skips the update on every rank and halves it; loss_scale_window clean steps double it.
  float loss_scale() const;
  // The learning rate the next Step() will use: the scheduler at step(), for the parameters without an lr of
  // their own (shard::ParamSpec::own_lr), or for those whose own lr is `own_lr` (Note [Param groups]).
  double next_lr() const;
  double next_lr(std::optional<double> own_lr) const;
  MemoryStats memory_stats() const;
  // Threads of the host optimizer update (strata.optimizer_threads, resolved). SetOptimizerThreads
  // replaces the pool between steps (0 = the default); the results are the same bits for every count,
  // so only the time changes (`strata bench step` compares 1 thread with the configured count).
  int optimizer_threads() const;
  absl::Status SetOptimizerThreads(int threads);
  void ResetPeakMemory();
  device::Timeline& timeline();

 // Opaque internal state (engine_impl.h); public only so the engine's own files can name it.
  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  // Note [Asynchronous checkpoints]: made by the first SaveCheckpointAsync; outside Impl, which it never
  // touches (docs/decisions/0036-async-checkpoints.md).
  std::unique_ptr<checkpoint::AsyncSaver> async_saver_;
};

}  // namespace strata::engine
