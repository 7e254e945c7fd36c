// The optimizer step: wait for the gradient reductions, then optim::RunOptimizerStep over the state
// store (average, global norm: one all-reduce of the shard norms, clip, update each rank's range with
// the cast to the param dtype), re-replicate (stages 1-2), zero the gradients, the loss scale. A
// non-finite norm skips the update on every rank (the norm is global, so every rank reaches the same
// decision) and is reported in the result. Host-memory updates run on
// host_executor (strata.optimizer_threads): the fused kernels give the same bits for every thread
// count, so the thread count is a speed knob only. The norm stays the sequential optim::SumSquares,
// whose order the executor's vectorised sum does not reproduce.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/step.h"

namespace strata::engine {

absl::Status Engine::Impl::SetOptimizerThreads(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer threads must be >= 0 (0 = the default), got ", threads));
  }
  EngineConfig resolved = cfg;
  resolved.optimizer_threads = threads;
  const int n = OptimizerThreads(resolved);
  host_executor.reset();  // before the new pool, so the two never both hold workers
  if (n == 1) return absl::OkStatus();  // the calling thread: exactly the single-threaded path
  // The variant ApplyUpdate uses without an executor (STRATA_CPU_ISA, else the widest), so that only
  // the thread count differs.
  STRATA_ASSIGN_OR_RETURN(host_executor,
                          optim::HostExecutor::Create(n, kernels::cpu::IsaName(optim::DefaultHostKernels().isa)));
  return absl::OkStatus();
}

absl::Status Engine::SetOptimizerThreads(int threads) {
  if (impl_->in_micro_batch) return absl::FailedPreconditionError("SetOptimizerThreads() inside an open micro-batch");
  return impl_->SetOptimizerThreads(threads);
}

int Engine::optimizer_threads() const { return impl_->host_executor ? impl_->host_executor->threads() : 1; }

// `master` is host memory; the param storage ParamStorage hands out is too.
absl::Status Engine::Impl::CastMasterToParams(UnitState& u, const float* master) {
  if (!separate_master()) return absl::OkStatus();  // the master is the param storage
  return UpdateParamStorage(u, [&](char* params) {
    return host_ops->Cast(cfg.param_dtype, master, params, update_elems(u));
  });
}

absl::Status Engine::Impl::ReplicateParams(bool frozen_too) {
  if (cfg.stage != 1 && cfg.stage != 2) return absl::OkStatus();
  std::vector<comm::Work> works;
  for (UnitState& u : units) {
    if (u.frozen() && !frozen_too) continue;  // unchanged since the last replication (Note [Frozen units])
    char* base = u.params.as<char>();
    works.push_back(step_comm->AllGather(base + update_begin(u) * param_bytes(), base, u.layout.shard_elems,
                                         cfg.param_dtype, *step_stream));
  }
  for (comm::Work& w : works) STRATA_RETURN_IF_ERROR(TimedWait([&] { return w.Wait(); }));
  return absl::OkStatus();
}

absl::Status Engine::Impl::ZeroGrads() {
  for (UnitState& u : units) {
    if (!u.frozen()) STRATA_RETURN_IF_ERROR(OptimizerOps().Zero(u.grads.data(), u.grads.bytes()));
  }
  return absl::OkStatus();
}

namespace {
optim::GradOps GradOpsOf(TierOps& t) {
  return optim::GradOps{[&t](float* p, size_t n, float factor) { return t.Scale(p, n, factor); },
                        [&t](const float* p, size_t n) { return t.SumSquares(p, n); }};
}
}  // namespace

absl::StatusOr<StepResult> Engine::Impl::RunStep() {
  STRATA_RETURN_IF_ERROR(reducer->Finish());
  const int64_t update_start = device::NowNs();
  int64_t waited_in_update = exposed_comm_ns;
  optim::StepInputs in;
  in.grad_scale =
      1.0f / (static_cast<float>(world_size() * cfg.gradient_accumulation_steps) * loss_scaler.scale());
  in.lr = optim::ScheduledLr(cfg.scheduler, cfg.optimizer.lr, step);
  in.step = step + 1;
  in.max_norm = cfg.gradient_clipping;
  in.param_dtype = cfg.param_dtype;
  in.executor = host_executor.get();
  // Stage 0 holds the full, already averaged gradient on every rank. Replicas of a shard group hold the
  // same shards, so the group's sum is the global one (engine_groups.cc).
  if (cfg.stage != 0) {
    in.sum_across_ranks = [&](float* total_sq) {
      return TimedWait([&] {
        return group_control->AllReduce(total_sq, total_sq, 1, DType::kF32, comm::ReduceOp::kSum, *control_stream)
            .Wait();
      });
    };
  }
  std::vector<optim::StepUnit> step_units;
  for (UnitState& u : units) {
    if (u.frozen()) continue;  // no gradient, no update, no norm term (Note [Frozen units])
    optim::ParamsAccess params;
    params.on_host = [this, &u](const std::function<absl::Status(char*)>& fn) { return UpdateParamStorage(u, fn); };
    // Device state updates device params in place (no param buffer with parameter shards on NVMe).
    params.in_place = u.params.data() == nullptr ? nullptr : u.params.as<char>() + UpdateParamOffset(u);
    step_units.push_back({GradUpdatePtr(u), update_elems(u), &u.ext.update_segments, std::move(params), UnitIndex(u)});
  }
  STRATA_ASSIGN_OR_RETURN(const optim::StepOutcome out,
                          optim::RunOptimizerStep(*state, cfg.optimizer, GradOpsOf(OptimizerOps()), step_units, in));
  exposed_io_ns += out.io.read_wait_ns + out.io.write_wait_ns;
  nvme_read_bytes += out.io.bytes_read;
  nvme_write_bytes += out.io.bytes_written;
  StepResult r;
  r.grad_norm = out.grad_norm;
  r.lr = in.lr;
  if (out.skipped) {
    r.skipped = true;
    loss_scaler.Overflow();
    STRATA_LOG(Warning) << "step " << step + 1 << ": non-finite gradient norm; the update is skipped on every rank"
                        << (loss_scaler.dynamic() ? absl::StrCat(", loss scale now ", loss_scaler.scale())
                                                  : std::string());
    STRATA_RETURN_IF_ERROR(ZeroGrads());
    r.step = step;
    r.loss_scale = loss_scaler.scale();
    return r;
  }
  r.clip_coef = out.clip_coef;
  STRATA_RETURN_IF_ERROR(ReplicateParams());
  STRATA_RETURN_IF_ERROR(ZeroGrads());
  const int64_t update_end = device::NowNs();
  r.optimizer_ms = 1e-6 * double(update_end - update_start - (exposed_comm_ns - waited_in_update));
  timeline.Add(device::Span{"step", "optimizer", -1, update_start, update_end});
  loss_scaler.CleanStep();
  r.loss_scale = loss_scaler.scale();
  r.step = ++step;
  return r;
}

absl::StatusOr<StepResult> Engine::Step() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "Step"));
  if (m.in_micro_batch) return absl::FailedPreconditionError("Step() inside an open micro-batch");
  if (m.micro_batch != m.cfg.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("Step() after ", m.micro_batch, " micro-batches; "
                                                      "gradient_accumulation_steps=", m.cfg.gradient_accumulation_steps));
  }
  auto r = m.RunStep();
  if (!r.ok() && m.failed.empty()) m.failed = std::string(r.status().message());
  m.micro_batch = 0;
  if (r.ok()) {
    r->compute_ms = 1e-6 * double(m.compute_ns);
    r->exposed_comm_ms = 1e-6 * double(m.exposed_comm_ns);
    r->exposed_io_ms = 1e-6 * double(m.exposed_io_ns);
    r->nvme_read_bytes = m.nvme_read_bytes;
    r->nvme_write_bytes = m.nvme_write_bytes;
    if (m.param_cache != nullptr) {
      const offload::ShardCacheStats& now = m.param_cache->stats();
      r->nvme_read_bytes += now.read_bytes - m.param_io_mark.read_bytes;
      r->nvme_write_bytes += now.write_bytes - m.param_io_mark.write_bytes;
      m.param_io_mark = now;
    }
  }
  m.compute_ns = m.exposed_comm_ns = m.exposed_io_ns = 0;
  m.nvme_read_bytes = m.nvme_write_bytes = 0;
  return r;
}

}  // namespace strata::engine
