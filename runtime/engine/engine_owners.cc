// The unit's protocol (Note [Unit protocol]) and the owners the hooks and the step delegate to, chosen once
// at Finalize (Note [Unit owners], unit_owners.h): the stage's parameter owner with the gatherer (stage 3),
// the gradient owners of frozen and trained units over the reducer, and the update after the step or in
// backward (Note [Optimizer in backward], below).
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/engine/unit_owners.h"

namespace strata::engine {

// ---- UnitProtocol ----

absl::Status UnitProtocol::CheckPreForward(const std::string& unit) const {
  if (backward_uses_ == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("BeginForward('", unit, "') after its backward began in this micro-batch"));
}

absl::Status UnitProtocol::CheckPreBackward(const std::string& unit) const {
  if (backward_uses_ < forward_uses_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("BeginBackward('", unit, "'): ", backward_uses_ + 1,
                                                    " backward uses but only ", forward_uses_,
                                                    " forward uses in this micro-batch"));
}

absl::StatusOr<int64_t> UnitProtocol::EndCompute() {
  --active_;
  return compute_start_ns_;
}

absl::StatusOr<int64_t> UnitProtocol::PostForward(const std::string& unit) {
  if (active_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("EndForward('", unit, "') without BeginForward"));
  }
  return EndCompute();
}

absl::StatusOr<int64_t> UnitProtocol::PostBackward(const std::string& unit) {
  if (active_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("EndBackward('", unit, "') without BeginBackward"));
  }
  return EndCompute();
}

absl::Status UnitProtocol::CheckMicroBatchEnd(const std::string& unit) const {
  if (active_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat("EndMicroBatch(): unit '", unit, "' was begun but not ended"));
  }
  if (forward_uses_ != backward_uses_) {
    return absl::FailedPreconditionError(absl::StrCat("EndMicroBatch(): unit '", unit, "' had ", forward_uses_,
                                                      " forward but ", backward_uses_,
                                                      " backward uses; every forward use needs its backward"));
  }
  return absl::OkStatus();
}

namespace {

// ---- ParamsOwner: by stage ----

// Stages 1-3: the shard group's slices of the unit's master, in order (GatherUnit).
absl::StatusOr<std::vector<float>> AllGatherMaster(Engine::Impl& m, int unit, const std::vector<float>& mine) {
  const UnitState& u = m.units[unit];
  std::vector<float> full(u.layout.total_elems);
  STRATA_RETURN_IF_ERROR(
      m.rt.group_control->AllGather(mine.data(), full.data(), u.layout.shard_elems, DType::kF32, *m.rt.control_stream)
          .Wait());
  return full;
}

// Stage 0: every rank holds and updates the whole unit; nothing to gather, reshard or replicate.
class ResidentParams : public ParamsOwner {
 public:
  explicit ResidentParams(Engine::Impl& m) : m_(m) {}
  absl::Status EvaluationUse(int) override { return absl::OkStatus(); }
  absl::Status Issue(int) override { return absl::OkStatus(); }
  void Prefetch(int) override {}
  absl::Status Ensure(int) override { return absl::OkStatus(); }
  void Reshard(int) override {}
  char* Base(int unit) const override { return m_.units[unit].params.as<char>(); }
  absl::Status AfterUpdate(const std::vector<int>&) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<float>> WholeMaster(int, std::vector<float> mine) override { return mine; }

 protected:
  Engine::Impl& m_;
};

// Stages 1-2: every rank holds the whole unit and updates its slice; the step all-gathers the slices.
class ReplicatedParams : public ResidentParams {
 public:
  using ResidentParams::ResidentParams;
  absl::Status AfterUpdate(const std::vector<int>& units) override {
    std::vector<comm::Work> works;
    for (int i : units) {
      UnitState& u = m_.units[i];
      char* base = u.params.as<char>();
      works.push_back(m_.rt.step_comm->AllGather(base + u.update_begin() * m_.storage.param_bytes(), base,
                                                 u.layout.shard_elems, m_.cfg.param_dtype, *m_.rt.step_stream));
    }
    for (comm::Work& w : works) STRATA_RETURN_IF_ERROR(m_.progress.TimedWait([&] { return w.Wait(); }));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> WholeMaster(int unit, std::vector<float> mine) override {
    return AllGatherMaster(m_, unit, mine);
  }
};

// Stage 3: the rank holds its shard; each use gathers the unit into a pooled buffer (shard::Gatherer),
// with prefetch along the recorded schedule, and releases it when no compute uses it. The update writes
// the shards the next gather reads.
class GatheredParams : public ParamsOwner {
 public:
  GatheredParams(Engine::Impl& m, std::unique_ptr<shard::Gatherer> gatherer) : m_(m), g_(std::move(gatherer)) {}
  absl::Status EvaluationUse(int unit) override { return m_.AgreeOnUse(3, unit); }  // Note [Agreed schedule]
  absl::Status Issue(int unit) override { return g_->IssueIfNeeded(unit); }
  void Prefetch(int current) override {
    if (m_.cfg.prefetch_depth <= 0) return;
    // Gathers along the recorded schedule; with NVMe shards, reads further ahead, as far as free buffers allow.
    g_->Prefetch(m_.schedule->Upcoming(m_.cfg.prefetch_depth, current),
                 m_.schedule->Upcoming(g_->read_ahead_depth(), current));
  }
  absl::Status Ensure(int unit) override { return g_->Ensure(unit); }
  // Host compute is synchronous: the slot's last reader has finished, so no fence is needed.
  void Reshard(int unit) override { g_->Release(unit); }
  char* Base(int unit) const override { return g_->data(unit); }
  absl::Status AfterUpdate(const std::vector<int>&) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<float>> WholeMaster(int unit, std::vector<float> mine) override {
    return AllGatherMaster(m_, unit, mine);
  }
  void Drain() override { g_->Drain(); }

 private:
  Engine::Impl& m_;
  std::unique_ptr<shard::Gatherer> g_;
};

// Where the shards come from is decided here, once (shard/param_source.h).
std::unique_ptr<shard::ParamSource> HostParamSource(Engine::Impl& m, shard::SourceEnv env) {
  if (m.storage.nvme_params()) {
    const ParamStore& p = m.storage.pstore;
    return shard::MakeCachedSource(p.param_cache.get(), static_cast<int>(p.param_buffers->buffer_count()),
                                   std::move(env));
  }
  std::vector<const void*> shards;  // the units' buffers are allocated (Finalize) and stay where they are
  for (const UnitState& u : m.units) shards.push_back(u.params.data());
  return shard::MakeMemorySource(std::move(shards));
}

absl::StatusOr<std::unique_ptr<shard::Gatherer>> MakeGatherer(Engine::Impl& m, const shard::SlotPlan& slots) {
  STRATA_ASSIGN_OR_RETURN(
      shard::SlotPool pool,
      shard::SlotPool::Create(*m.rt.device_alloc, slots, m.storage.param_bytes(), memory::Kind::kGathered));
  if (m.cfg.release_idle_memory) pool.ReleaseIdle();  // Note [Idle pages]: no slot is used yet
  std::vector<shard::GatherUnit> gathered;
  shard::SourceEnv env{{}, &m.progress.exposed_io_ns};
  for (const UnitState& u : m.units) {
    gathered.push_back({u.layout.name, u.layout.shard_elems});
    env.unit_names.push_back(u.layout.name);
  }
  std::unique_ptr<shard::ParamSource> source = HostParamSource(m, std::move(env));
  // Note [Staged gathers]
  if (m.cfg.offload_param.device != OffloadDevice::kNone && m.rt.gather_comm->device_buffers()) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> copy_stream, m.rt.device->CreateStream("h2d"));
    STRATA_ASSIGN_OR_RETURN(source, shard::MakeStagedSource(std::move(source), std::move(copy_stream), *m.rt.device,
                                                            pool.size(), *m.rt.device_ops, &m.progress.timeline));
  }
  return std::make_unique<shard::Gatherer>(
      std::move(pool), std::move(gathered), std::move(source),
      shard::GathererOptions{m.rt.gather_comm.get(), m.rt.gather_stream.get(), m.cfg.param_dtype, m.rt.shard_rank,
                             &m.progress.timeline, &m.progress.exposed_comm_ns});
}

// ---- GradOwner: frozen or trained ----

// Note [Frozen units]: no working buffer, no mark, no reduction.
class FrozenGrads : public GradOwner {
 public:
  absl::Status PreBackward(int) override { return absl::OkStatus(); }
  float* Working(int) const override { return nullptr; }
  void MarkNoGrad(UnitState&, int, int) override {}
  absl::Status LastBackwardUse(int) override { return absl::OkStatus(); }
};

class TrainedGrads : public GradOwner {
 public:
  explicit TrainedGrads(Engine::Impl& m) : m_(m) {}
  absl::Status PreBackward(int unit) override { return m_.owners.reducer->Acquire(unit); }
  float* Working(int unit) const override { return m_.owners.reducer->working(unit); }
  void MarkNoGrad(UnitState& u, int param, int micro_batch) override {
    if (u.no_grad_marked_in[param] == micro_batch) return;  // counted once per micro-batch
    u.no_grad_marked_in[param] = micro_batch;
    ++u.no_grad_micro_batches[param];
  }
  absl::Status LastBackwardUse(int unit) override {
    if (!m_.owners.reducer->reduces(m_.progress.micro_batch == m_.cfg.gradient_accumulation_steps - 1))
      return absl::OkStatus();
    return m_.owners.update->Reduce(unit);
  }

 private:
  Engine::Impl& m_;
};

// ---- UpdateOwner: after the step, or in backward ----

// The reduction accumulates into the unit's gradient shard; the step updates every trained unit.
class UpdateAtStep : public UpdateOwner {
 public:
  explicit UpdateAtStep(Engine::Impl& m) : m_(m) {}
  absl::Status Reduce(int unit) override { return m_.owners.reducer->Reduce(unit); }
  absl::Status CheckNoPendingUpdate(const char*) const override { return absl::OkStatus(); }
  bool update_pending() const override { return false; }
  absl::Status CheckLeftOut(bool) const override { return absl::OkStatus(); }
  absl::StatusOr<optim::StepOutcome> Update(const std::vector<int>& trained, const optim::StepInputs& in) override {
    std::vector<optim::StepUnit> step_units;
    for (int i : trained) {
      UnitState& u = m_.units[i];
      step_units.push_back(
          m_.storage.StepUnitOf(u, u.GradUpdatePtr(), m_.progress.SegmentsOf(i, u.ext.update_segments)));
    }
    return optim::RunOptimizerStep(*m_.storage.state, m_.cfg.optimizer, m_.storage.OptimizerOps(), step_units, in);
  }

 private:
  Engine::Impl& m_;
};

// Note [Optimizer in backward]. With strata.optimizer_in_backward (stages 2-3, one micro-batch per step,
// no clipping, no fp16: CheckOptimizerInBackward) no unit keeps a gradient shard. The reduce-scatter of a
// unit's last backward use leaves its shard in the reducer's scratch (or the scratch's pinned staging),
// and that unit's update consumes it there: scaled, its sum of squares kept, then StateStore::Step with
// clip coefficient 1, the same operations in the same order over the same values as RunOptimizerStep
// over a shard that was zero before the reduction (0 + x is x), so the bits are the same.
//
// Protocol. The scratch is one buffer in reduce-stream order, so the update of unit u must have read it
// before the next reduction is enqueued. EndBackward(u) therefore first updates the pending unit (the one
// reduced before u: its reduce-scatter ran during u's backward, so waiting for it rarely waits), then
// enqueues u's reduction and leaves u pending (Reduce below); the step (Update below, from RunStep) updates
// the last pending unit. The updates run on the trainer's thread, between hooks, so nothing else runs on
// the state store, the parameter cache or the param storage's scratch meanwhile. The update writes the
// unit's param storage (its shard at stage 3, its slice at stage 2, or the NVMe cache entry through
// shard::ParamStorage). Nothing can be reading it: the unit's own gather completed before its backward began
// (Gatherer::Ensure), and it has no later use in this step: this was its last backward use, every forward
// use has its backward (EndMicroBatch), a forward after a backward is refused, and prefetch follows the
// recorded schedule only to the end of the micro-batch (Schedule::Upcoming), so no gather of it is issued
// before the next step's forward, which comes after Step(). At stage 2 the other ranks' slices reach every
// rank in ParamsOwner::AfterUpdate, in Step(), as without the key. What it does not do yet: overlap the
// update with the next unit's backward (it would need a second scratch and the update on its own thread,
// which then shares the parameter cache with the trainer's prefetch).
class UpdateInBackward : public UpdateOwner {
 public:
  explicit UpdateInBackward(Engine::Impl& m) : m_(m) {}

  absl::Status Reduce(int unit) override {
    STRATA_RETURN_IF_ERROR(UpdatePending());
    STRATA_RETURN_IF_ERROR(m_.owners.reducer->Reduce(unit));
    pending_ = unit;
    return absl::OkStatus();
  }

  absl::Status CheckNoPendingUpdate(const char* what) const override {
    if (pending_ < 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, " between the last backward and Step() with strata.optimizer_in_backward: unit '",
        m_.units[pending_].layout.name, "' is not updated yet while the others are; call it after Step()"));
  }
  bool update_pending() const override { return pending_ >= 0; }

  absl::Status CheckLeftOut(bool left_out) const override {
    if (!left_out) return absl::OkStatus();
    for (size_t i = 0; i < m_.units.size(); ++i) {
      for (size_t p = 0; p < m_.progress.had_grad[i].size(); ++p) {
        if (m_.progress.had_grad[i][p]) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "Step(): parameter '", m_.units[i].layout.name, ".", m_.units[i].layout.params[p].spec.name,
            "' had no gradient on any rank in this step, but with strata.optimizer_in_backward its update already "
            "ran in the backward as if its gradient were zero; torch would have skipped it. Turn "
            "strata.optimizer_in_backward off, or set strata.params_without_grad to \"zero\" (DeepSpeed's rule)"));
      }
    }
    return absl::OkStatus();
  }

  // The global norm from the units' sums, in unit order as RunOptimizerStep sums them (the same bits).
  absl::StatusOr<optim::StepOutcome> Update(const std::vector<int>& trained, const optim::StepInputs& in) override {
    STRATA_RETURN_IF_ERROR(UpdatePending());
    const size_t n = m_.units.size();
    sq_.resize(n, 0.0);
    done_.resize(n, 0);
    for (int i : trained) {  // a frozen unit has no update (Note [Frozen units])
      if (done_[i]) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "Step(): unit '", m_.units[i].layout.name,
          "' had no backward in this step; with "
          "strata.optimizer_in_backward each unit's update runs in its backward, so every unit needs one"));
    }
    optim::StepOutcome out;
    double local_sq = 0;
    for (size_t i = 0; i < n; ++i) local_sq += sq_[i];
    STRATA_RETURN_IF_ERROR(optim::GlobalNorm(local_sq, in, &out));
    out.io = io_;
    sq_.assign(n, 0.0);
    done_.assign(n, 0);
    io_ = offload::TilePipelineStats{};
    if (out.skipped) {
      return absl::DataLossError(
          absl::StrCat("step ", m_.progress.step + 1,
                       ": non-finite gradient norm with strata.optimizer_in_backward; the units with finite "
                       "gradients were already updated in backward, so the step cannot be skipped as a whole"));
    }
    return out;
  }

  int64_t TakeUpdateNs() override { return std::exchange(update_ns_, 0); }

 private:
  absl::Status UpdatePending() {
    if (pending_ < 0) return absl::OkStatus();
    const int unit = pending_;
    pending_ = -1;
    STRATA_RETURN_IF_ERROR(m_.owners.reducer->Finish());
    const int64_t t0 = device::NowNs();
    UnitState& u = m_.units[unit];
    const optim::StepInputs in = m_.StepInputsNow();
    const optim::StepUnit su =
        m_.storage.StepUnitOf(u, m_.owners.reducer->reduced(), m_.progress.SegmentsOf(unit, u.ext.update_segments));
    STRATA_ASSIGN_OR_RETURN(const double sq, optim::ScaleAndSumSquares(m_.storage.OptimizerOps(), su, in.grad_scale));
    sq_.resize(m_.units.size(), 0.0);
    done_.resize(m_.units.size(), 0);
    sq_[unit] = sq;
    done_[unit] = 1;
    // A non-finite gradient is not applied; the step reports it as failed (Update).
    if (std::isfinite(sq)) {
      STRATA_RETURN_IF_ERROR(optim::UpdateUnit(*m_.storage.state, m_.cfg.optimizer, unit, su, in, 1.0f, &io_));
    }
    const int64_t t1 = device::NowNs();
    update_ns_ += t1 - t0;
    m_.progress.timeline.Add(device::Span{"step", "optimizer", unit, t0, t1});
    return absl::OkStatus();
  }

  Engine::Impl& m_;
  // The unit whose reduction is enqueued but not yet consumed by its update (-1: none), per unit whether it
  // was updated in this step's backward and its local sum of squares, and what the updates cost.
  int pending_ = -1;
  std::vector<char> done_;
  std::vector<double> sq_;
  offload::TilePipelineStats io_;
  int64_t update_ns_ = 0;
};

// Gradient reduction on reduce_comm / reduce_stream (shard/grad_reducer.h): all-reduce at stages 0-1,
// reduce-scatter of pooled working buffers at stages 2-3. Gradient staging (a pinned host copy of the
// reduce scratch) when the gradient shards are in host memory but the reduction ran in device memory
// (CUDA with offload_optimizer).
absl::StatusOr<std::unique_ptr<shard::GradReducer>> MakeReducer(Engine::Impl& m, const shard::SlotPlan& slots,
                                                                size_t largest_shard) {
  std::vector<shard::ReduceUnit> reduced;
  for (UnitState& u : m.units) {
    reduced.push_back({u.layout.name, u.layout.total_elems, u.layout.shard_elems, u.grads.as<float>()});
  }
  const shard::ReducerEnv env{m.rt.reduce_comm.get(), m.rt.reduce_stream.get(),    m.rt.device,
                              &m.progress.timeline,   &m.progress.exposed_comm_ns, m.rt.replica_comm.get()};
  if (m.cfg.stage <= 1) {  // full gradients accumulate locally; one all-reduce on the last micro-batch
    return shard::MakeAllReduceReducer(std::move(reduced), env);
  }
  memory::Allocator& device = *m.rt.device_alloc;
  STRATA_ASSIGN_OR_RETURN(shard::SlotPool pool, shard::SlotPool::Create(device, slots, 4, memory::Kind::kGradWorking,
                                                                        m.storage.GradAlignment(&device)));
  STRATA_ASSIGN_OR_RETURN(memory::Buffer scratch,
                          device.Allocate(largest_shard * 4, memory::Kind::kScratch, m.storage.GradAlignment(&device)));
  memory::Buffer staging;
  if (m.storage.GradStagingNeeded()) {
    STRATA_ASSIGN_OR_RETURN(staging, m.rt.host_alloc->Allocate(largest_shard * 4, memory::Kind::kScratch));
  }
  // The working buffers are on the device tier, the gradient shards on the optimizer's; without shards the
  // update in backward reads the reduced shard itself.
  shard::ReduceOps ops{m.rt.device_ops.get(), m.storage.place.grad_shards ? &m.storage.OptimizerOps() : nullptr};
  return shard::MakeReduceScatterReducer(std::move(reduced), env, std::move(ops), std::move(pool), std::move(scratch),
                                         std::move(staging));
}

}  // namespace

// Note [Unit owners]: every choice by stage, frozenness and strata.optimizer_in_backward is made here.
absl::Status UnitOwners::SetUp(Engine::Impl& m, const PoolPlans& pools, size_t largest_trained_shard) {
  *this = UnitOwners{};  // Finalize may run again after it failed
  for (UnitState& u : m.units) u.grad = nullptr;
  for (int i = 0; i < static_cast<int>(m.units.size()); ++i) {
    all.push_back(i);
    if (!m.units[i].frozen()) trained.push_back(i);
  }
  if (m.cfg.stage == 3) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<shard::Gatherer> gatherer, MakeGatherer(m, pools.gathered));
    params = std::make_unique<GatheredParams>(m, std::move(gatherer));
  } else if (m.cfg.stage == 0) {
    params = std::make_unique<ResidentParams>(m);
  } else {
    params = std::make_unique<ReplicatedParams>(m);
  }
  STRATA_ASSIGN_OR_RETURN(reducer, MakeReducer(m, pools.grads, largest_trained_shard));
  frozen_grads = std::make_unique<FrozenGrads>();
  trained_grads = std::make_unique<TrainedGrads>(m);
  for (UnitState& u : m.units) u.grad = u.frozen() ? frozen_grads.get() : trained_grads.get();
  if (m.cfg.optimizer_in_backward) {
    update = std::make_unique<UpdateInBackward>(m);
  } else {
    update = std::make_unique<UpdateAtStep>(m);
  }
  if (m.cfg.stage != 0) norm_comm = m.rt.group_control;
  return absl::OkStatus();
}

}  // namespace strata::engine
