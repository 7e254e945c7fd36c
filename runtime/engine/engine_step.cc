// The optimizer step: wait for the gradient reductions, average, global norm (one all-reduce of the
// shard norms), clip, update each rank's range, cast to the param dtype, re-replicate (stages 1-2),
// zero the gradients. A non-finite norm skips the update on every rank (the norm is global, so every
// rank reaches the same decision) and is reported in the result. Host-memory updates run on
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

absl::Status Engine::Impl::ReplicateParams() {
  if (cfg.stage != 1 && cfg.stage != 2) return absl::OkStatus();
  std::vector<comm::Work> works;
  for (UnitState& u : units) {
    char* base = u.params.as<char>();
    works.push_back(step_comm->AllGather(base + update_begin(u) * param_bytes(), base, u.layout.shard_elems,
                                         cfg.param_dtype, *step_stream));
  }
  for (comm::Work& w : works) STRATA_RETURN_IF_ERROR(TimedWait([&] { return w.Wait(); }));
  return absl::OkStatus();
}

absl::Status Engine::Impl::ZeroGrads() {
  for (UnitState& u : units) STRATA_RETURN_IF_ERROR(OptimizerOps().Zero(u.grads.data(), u.grads.bytes()));
  return absl::OkStatus();
}

absl::Status Engine::Impl::MemoryUpdate(UnitState& u, double lr, float clip_coef) {
  optim::ShardState s{MasterPtr(u), GradUpdatePtr(u), u.m.as<float>(), u.v.as<float>()};
  // The fused pass also writes the low-precision param copy (`params`: the update range of the param
  // storage); an fp32 master kept apart is copied.
  auto update = [&](char* params) -> absl::Status {
    const bool copy = cfg.param_dtype != DType::kF32;
    STRATA_RETURN_IF_ERROR(OptimizerOps().Update(cfg.optimizer, s, u.ext.update_segments, lr, step + 1, clip_coef,
                                                 copy ? reinterpret_cast<uint16_t*>(params) : nullptr,
                                                 cfg.param_dtype));
    if (!copy && separate_master()) return OptimizerOps().Cast(DType::kF32, s.master, params, update_elems(u));
    return absl::OkStatus();
  };
  if (OptimizerOps().host_visible()) return UpdateParamStorage(u, update);
  return update(u.params.as<char>() + UpdateParamOffset(u));  // device state, device params (Note [Tier ops])
}

absl::StatusOr<StepResult> Engine::Impl::RunStep() {
  STRATA_RETURN_IF_ERROR(reducer->Finish());
  const int64_t update_start = device::NowNs();
  int64_t waited_in_update = exposed_comm_ns;
  const float inv = 1.0f / (static_cast<float>(world_size() * cfg.gradient_accumulation_steps) * loss_scale);
  double local_sq = 0;
  for (UnitState& u : units) {
    float* g = GradUpdatePtr(u);
    STRATA_RETURN_IF_ERROR(OptimizerOps().Scale(g, update_elems(u), inv));
    STRATA_ASSIGN_OR_RETURN(const double sq, OptimizerOps().SumSquares(g, update_elems(u)));
    local_sq += sq;
  }
  float total_sq = static_cast<float>(local_sq);
  // Stage 0 holds the full, already averaged gradient on every rank. Replicas of a shard group hold the
  // same shards, so the group's sum is the global one (engine_groups.cc).
  if (cfg.stage != 0) {
    STRATA_RETURN_IF_ERROR(TimedWait([&] {
      return group_control->AllReduce(&total_sq, &total_sq, 1, DType::kF32, comm::ReduceOp::kSum, *control_stream)
          .Wait();
    }));
  }
  StepResult r;
  r.grad_norm = std::sqrt(static_cast<double>(total_sq));
  r.lr = optim::ScheduledLr(cfg.scheduler, cfg.optimizer.lr, step);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    const bool dynamic = cfg.fp16.enabled && cfg.fp16.static_loss_scale <= 0;
    if (dynamic) {
      loss_scale = std::max(loss_scale / 2, static_cast<float>(cfg.fp16.min_loss_scale));
      clean_steps = 0;
    }
    STRATA_LOG(Warning) << "step " << step + 1 << ": non-finite gradient norm; the update is skipped on every rank"
                        << (dynamic ? absl::StrCat(", loss scale now ", loss_scale) : std::string());
    STRATA_RETURN_IF_ERROR(ZeroGrads());
    r.step = step;
    r.loss_scale = loss_scale;
    return r;
  }
  r.clip_coef = optim::ClipCoefficient(r.grad_norm, cfg.gradient_clipping);
  // Units are independent here, so the order is free: last to first, so that with parameter shards on
  // NVMe the cache keeps the first units (the most recently written), which the next forward needs first.
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    STRATA_RETURN_IF_ERROR(UpdateUnit(*it, r.lr, r.clip_coef));
  }
  STRATA_RETURN_IF_ERROR(ReplicateParams());
  STRATA_RETURN_IF_ERROR(ZeroGrads());
  const int64_t update_end = device::NowNs();
  r.optimizer_ms = 1e-6 * double(update_end - update_start - (exposed_comm_ns - waited_in_update));
  timeline.Add(device::Span{"step", "optimizer", -1, update_start, update_end});
  if (cfg.fp16.enabled && cfg.fp16.static_loss_scale <= 0 && ++clean_steps >= cfg.fp16.loss_scale_window) {
    loss_scale *= 2;
    clean_steps = 0;
  }
  r.loss_scale = loss_scale;
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
