// The optimizer step: wait for the gradient reductions, then optim::RunOptimizerStep over the state
// store (average, global norm: one all-reduce of the shard norms, clip, update each rank's range with
// the cast to the param dtype), re-replicate (stages 1-2), zero the gradients, the loss scale. A
// non-finite norm skips the update on every rank (the norm is global, so every rank reaches the same
// decision) and is reported in the result. Host-memory updates run on
// host_executor (strata.optimizer_threads): the fused kernels give the same bits for every thread
// count, so the thread count is a speed knob only. The norm stays the sequential optim::SumSquares,
// whose order the executor's vectorised sum does not reproduce. With strata.optimizer_in_backward the
// units' updates run in backward instead (Note [Optimizer in backward]) and RunStep only finishes them.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/step.h"

namespace strata::engine {

absl::Status EngineRuntime::SetOptimizerThreads(const EngineConfig& cfg, int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer threads must be >= 0 (0 = the default), got ", threads));
  }
  EngineConfig resolved = cfg;
  resolved.optimizer_threads = threads;
  const int n = OptimizerThreads(resolved);
  host_threads = memory::HostThreads{};
  host_executor.reset();                // before the new pool, so the two never both hold workers
  if (n == 1) return absl::OkStatus();  // the calling thread: exactly the single-threaded path
  // The variant ApplyUpdate uses without an executor (STRATA_CPU_ISA, else the widest), so that only
  // the thread count differs.
  STRATA_ASSIGN_OR_RETURN(host_executor,
                          optim::HostExecutor::Create(n, kernels::cpu::IsaName(optim::DefaultHostKernels().isa)));
  host_threads = memory::HostThreads{&host_executor->kernels(), host_executor->pool()};
  return absl::OkStatus();
}

absl::Status Engine::SetOptimizerThreads(int threads) {
  if (impl_->progress.in_micro_batch)
    return absl::FailedPreconditionError("SetOptimizerThreads() inside an open micro-batch");
  return impl_->rt.SetOptimizerThreads(impl_->cfg, threads);
}

int Engine::optimizer_threads() const { return impl_->rt.host_executor ? impl_->rt.host_executor->threads() : 1; }

absl::Status Engine::Impl::ZeroGrads() {
  // Note [Idle pages]: nothing in the gradient memory is live until the next backward (the reductions
  // are finished, and with strata.optimizer_in_backward the last unit's update has read the reduced
  // shard), so it gives its pages back; a handed-back shard reads as zero.
  // Every caller runs outside a step or after the update in backward's last update: none is pending.
  STRATA_CHECK_MSG(!owners.update->update_pending(), "ZeroGrads with an in-backward update pending");
  if (cfg.release_idle_memory && owners.reducer != nullptr) owners.reducer->ReleaseIdle();
  if (!storage.place.grad_shards) return absl::OkStatus();  // strata.optimizer_in_backward keeps none
  // A frozen unit has no gradient (Note [Frozen units]).
  for (int i : owners.trained) {
    UnitState& u = units[i];
    if (cfg.release_idle_memory && u.grads.DiscardToZero()) continue;
    STRATA_RETURN_IF_ERROR(storage.OptimizerOps().Zero(u.grads.data(), u.grads.bytes()));
  }
  return absl::OkStatus();
}

double StepState::NextLr(const EngineConfig& cfg, std::optional<double> own_lr) const {
  return optim::GroupLr(cfg.scheduler, cfg.optimizer.lr, own_lr, step);
}

int ParamGroups::GroupOf(const shard::ParamSpec& spec) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].lr == spec.own_lr && groups[g].weight_decay == spec.own_weight_decay) {
      return static_cast<int>(g);
    }
  }
  groups.push_back(OwnHyper{spec.own_lr, spec.own_weight_decay});
  return static_cast<int>(groups.size()) - 1;
}

optim::StepInputs Engine::Impl::StepInputsNow() {
  optim::StepInputs in;
  in.grad_scale =
      1.0f / (static_cast<float>(rt.world_size() * cfg.gradient_accumulation_steps) * progress.loss_scaler.scale());
  for (const ParamGroups::OwnHyper& g : param_groups.groups) {  // Note [Param groups]: [0], the config's, first
    in.groups.push_back(
        optim::GroupHyper{progress.NextLr(cfg, g.lr), g.weight_decay.value_or(cfg.optimizer.weight_decay)});
  }
  in.step = progress.step + 1;
  in.max_norm = cfg.gradient_clipping;
  in.param_dtype = cfg.param_dtype;
  in.executor = rt.host_executor.get();
  // Null at stage 0, which holds the full, already averaged gradient on every rank (UnitOwners::norm_comm).
  if (owners.norm_comm != nullptr) {
    in.norm_comm = owners.norm_comm;
    in.norm_stream = rt.control_stream;
    in.norm_wait_ns = &progress.exposed_comm_ns;  // as TimedWait charges it
  }
  return in;
}

// Note [Parameters without a gradient]. torch.optim skips a parameter whose .grad is None: no weight decay,
// no moment update, and its per-parameter step count does not advance. DeepSpeed updates it with a zero
// gradient (decayed, its moments moving). The engine's trainer contract is "+=" into zeroed buffers, so it
// cannot tell a zero gradient from none: the trainer says so with MarkNoGrad (strata.torch does, from
// autograd's post-accumulate-grad hooks), and a unit with no backward use in the step has none (the agreed
// schedule, Note [Agreed schedule]: every micro-batch and rank uses the same units). With
// strata.params_without_grad "skip", the step sums every rank's flags (1: this rank wrote the parameter a
// gradient in some micro-batch) in one all-reduce on the control communicator, so that every rank leaves
// out the same parameters: their segments are dropped from the update (master, moments and parameter
// storage untouched; stages 1-2 re-replicate the unchanged values), and skipped_steps counts the steps each
// missed, so that its next update uses its own step count (step - skipped_steps) for Adam's bias
// correction, as torch's per-parameter state["step"]. The gradient norm is unchanged (those gradients are
// zero). The counts are checkpointed (manifest format 3). With strata.optimizer_in_backward the updates run
// in the backward, before the marks are complete, so a parameter without a gradient is an error there.
// "zero" (the default of the C++ engine and the C ABI, whose trainers write every gradient) keeps
// DeepSpeed's rule and costs nothing.
absl::StatusOr<bool> StepState::SegmentsWithGrad(std::vector<UnitState>& units, const std::vector<int>& trained,
                                                 const EngineConfig& cfg, comm::Communicator& control,
                                                 device::Stream& control_stream) {
  step_segments.assign(units.size(), {});
  step_segments_own.assign(units.size(), 0);
  had_grad.assign(units.size(), {});
  if (!cfg.skip_params_without_grad) return false;
  std::vector<float> flags;
  for (int i : trained) {  // a frozen unit has no update (Note [Frozen units])
    const UnitState& u = units[i];
    const bool used = u.protocol.used_in_backward();  // the last micro-batch's: every micro-batch has the same
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      flags.push_back(used && u.no_grad_micro_batches[p] < cfg.gradient_accumulation_steps ? 1.0f : 0.0f);
    }
  }
  if (flags.empty()) return false;
  STRATA_RETURN_IF_ERROR(TimedWait([&] {
    return control
        .AllReduce(flags.data(), flags.data(), flags.size(), DType::kF32, comm::ReduceOp::kSum, control_stream)
        .Wait();
  }));
  bool left_out = false;
  size_t k = 0;
  for (int i : trained) {
    UnitState& u = units[i];
    std::vector<char>& had = had_grad[i];
    had.assign(u.layout.params.size(), 1);
    bool custom = false;
    for (size_t p = 0; p < had.size(); ++p) {
      had[p] = flags[k++] > 0.0f;
      custom |= !had[p] || u.skipped_steps[p] > 0;
      left_out |= !had[p];
    }
    if (!custom) continue;
    step_segments_own[i] = 1;
    for (const shard::Segment& s : u.ext.update_segments) {
      if (!had[s.param]) continue;
      shard::Segment t = s;
      if (u.skipped_steps[s.param] > 0) t.step = step + 1 - u.skipped_steps[s.param];
      step_segments[i].push_back(t);
    }
  }
  return left_out;
}

void StepState::CountSkippedSteps(std::vector<UnitState>& units) const {
  for (size_t i = 0; i < units.size() && i < had_grad.size(); ++i) {
    for (size_t p = 0; p < had_grad[i].size(); ++p) units[i].skipped_steps[p] += !had_grad[i][p];
  }
}

absl::StatusOr<StepResult> Engine::Impl::RunStep() {
  STRATA_RETURN_IF_ERROR(owners.reducer->Finish());
  const int64_t update_start = device::NowNs();
  int64_t waited_in_update = progress.exposed_comm_ns;
  const optim::StepInputs in = StepInputsNow();
  STRATA_ASSIGN_OR_RETURN(const bool left_out,
                          progress.SegmentsWithGrad(units, owners.trained, cfg, *rt.control,
                                                    *rt.control_stream));  // Note [Parameters without a gradient]
  UpdateOwner& update = *owners.update;  // Note [Unit owners]: after the step or in backward
  STRATA_RETURN_IF_ERROR(update.CheckLeftOut(left_out));
  // The trained units: a frozen one has no gradient, no update and no norm term (Note [Frozen units]).
  STRATA_ASSIGN_OR_RETURN(const optim::StepOutcome out, update.Update(owners.trained, in));
  progress.exposed_io_ns += out.io.read_wait_ns + out.io.write_wait_ns;
  progress.nvme_read_bytes += out.io.bytes_read;
  progress.nvme_write_bytes += out.io.bytes_written;
  StepResult r;
  r.grad_norm = out.grad_norm;
  r.lr = in.groups[0].lr;
  if (out.skipped) {
    r.skipped = true;
    if (!progress.loss_scaler.Overflow()) {  // Note [Dynamic loss scale]: DeepSpeed ends the run here too
      STRATA_RETURN_IF_ERROR(ZeroGrads());
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", progress.step + 1, ": non-finite gradient norm with the fp16 loss scale already at "
          "fp16.min_loss_scale (", progress.loss_scaler.scale(), "); the update is skipped and training cannot "
          "go on (DeepSpeed stops here too: \"Current loss scale already at minimum\"). Lower the learning rate, "
          "set gradient_clipping, or use bf16"));
    }
    STRATA_LOG(Warning) << "step " << progress.step + 1
                        << ": non-finite gradient norm; the update is skipped on every rank"
                        << (progress.loss_scaler.dynamic()
                                ? absl::StrCat(", loss scale now ", progress.loss_scaler.scale())
                                : std::string());
    STRATA_RETURN_IF_ERROR(ZeroGrads());
    r.step = progress.step;
    r.loss_scale = progress.loss_scaler.scale();
    return r;
  }
  r.clip_coef = out.clip_coef;
  progress.CountSkippedSteps(units);
  // Stages 1-2 all-gather the updated slices; frozen units are unchanged since the last replication.
  STRATA_RETURN_IF_ERROR(owners.params->AfterUpdate(owners.trained));
  STRATA_RETURN_IF_ERROR(ZeroGrads());
  const int64_t update_end = device::NowNs();
  r.optimizer_ms =
      1e-6 * double(update_end - update_start - (progress.exposed_comm_ns - waited_in_update) + update.TakeUpdateNs());
  progress.timeline.Add(device::Span{"step", "optimizer", -1, update_start, update_end});
  progress.loss_scaler.CleanStep();
  r.loss_scale = progress.loss_scaler.scale();
  r.step = ++progress.step;
  return r;
}

absl::StatusOr<StepResult> Engine::Step() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "Step"));
  if (m.progress.in_micro_batch) return absl::FailedPreconditionError("Step() inside an open micro-batch");
  if (m.progress.micro_batch != m.cfg.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("Step() after ", m.progress.micro_batch,
                                                      " micro-batches; "
                                                      "gradient_accumulation_steps=",
                                                      m.cfg.gradient_accumulation_steps));
  }
  // Note [Asynchronous checkpoints]: a save that failed since is reported here, before the step is taken.
  if (async_saver_ != nullptr) STRATA_RETURN_IF_ERROR(async_saver_->Failure());
  auto r = m.RunStep();
  if (!r.ok()) m.Poison(r.status());
  m.progress.micro_batch = 0;
  for (UnitState& u : m.units) {  // Note [Parameters without a gradient]: the marks are per step
    std::fill(u.no_grad_micro_batches.begin(), u.no_grad_micro_batches.end(), 0);
    std::fill(u.no_grad_marked_in.begin(), u.no_grad_marked_in.end(), -1);
  }
  if (r.ok()) {
    r->compute_ms = 1e-6 * double(m.progress.compute_ns);
    r->exposed_comm_ms = 1e-6 * double(m.progress.exposed_comm_ns);
    r->exposed_io_ms = 1e-6 * double(m.progress.exposed_io_ns);
    r->nvme_read_bytes = m.progress.nvme_read_bytes;
    r->nvme_write_bytes = m.progress.nvme_write_bytes;
    if (m.storage.pstore.param_cache != nullptr) {
      ParamStore& p = m.storage.pstore;
      const offload::ShardCacheStats& now = p.param_cache->stats();
      r->nvme_read_bytes += now.read_bytes - p.param_io_mark.read_bytes;
      r->nvme_write_bytes += now.write_bytes - p.param_io_mark.write_bytes;
      p.param_io_mark = now;
    }
  }
  m.progress.compute_ns = m.progress.exposed_comm_ns = m.progress.exposed_io_ns = 0;
  m.progress.nvme_read_bytes = m.progress.nvme_write_bytes = 0;
  return r;
}

}  // namespace strata::engine
