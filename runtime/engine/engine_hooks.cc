// Per-unit hooks: gathers (stage 3, with prefetch along the recorded schedule), working gradient
// buffers and gradient reduction on the reduce stream. See engine.h for the protocol and
// Note [Gather buffer reuse] in shard/slot_pool.h for buffer reuse.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/shard/stream_trace.h"

namespace strata::engine {

using shard::Phase;

absl::Status Engine::Impl::CheckUnit(int unit, const char* hook) const {
  if (!progress.finalized) return absl::FailedPreconditionError(absl::StrCat(hook, "(", unit, ") before Finalize()"));
  if (!progress.failed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(hook, " after an earlier failure: ", progress.failed));
  }
  if (unit < 0 || unit >= static_cast<int>(units.size())) {
    return absl::OutOfRangeError(absl::StrCat(hook, "(", unit, "): no such unit (", units.size(), " registered)"));
  }
  return absl::OkStatus();
}

// Where the shards come from is decided here, once (shard/param_source.h).
std::unique_ptr<shard::ParamSource> Engine::Impl::HostParamSource(shard::SourceEnv env) {
  if (nvme_params()) {
    return shard::MakeCachedSource(pstore.param_cache.get(), static_cast<int>(pstore.param_buffers->buffer_count()), std::move(env));
  }
  return shard::MakeMemorySource([this](int unit) -> const void* { return units[unit].params.data(); });
}

absl::Status Engine::Impl::SetUpGatherer(const shard::SlotPlan& slots) {
  STRATA_ASSIGN_OR_RETURN(shard::SlotPool pool,
                          shard::SlotPool::Create(*rt.device_alloc, slots, param_bytes(), memory::Kind::kGathered));
  if (cfg.release_idle_memory) pool.ReleaseIdle();  // Note [Idle pages]: no slot is used yet
  std::vector<shard::GatherUnit> gathered;
  shard::SourceEnv env{{}, &progress.exposed_io_ns};
  for (const UnitState& u : units) {
    gathered.push_back({u.layout.name, u.layout.shard_elems});
    env.unit_names.push_back(u.layout.name);
  }
  std::unique_ptr<shard::ParamSource> source = HostParamSource(std::move(env));
  if (cfg.offload_param.device != OffloadDevice::kNone && rt.gather_comm->device_buffers()) {  // Note [Staged gathers]
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> copy_stream, rt.device->CreateStream("h2d"));
    auto copy = [this](device::Stream& s, void* dst, const void* host, size_t bytes) {
      rt.device_ops->FromHostOn(s, dst, host, bytes);
    };
    STRATA_ASSIGN_OR_RETURN(source, shard::MakeStagedSource(std::move(source), std::move(copy_stream), *rt.device,
                                                            pool.size(), copy, &progress.timeline));
  }
  gatherer = std::make_unique<shard::Gatherer>(
      std::move(pool), std::move(gathered), std::move(source),
      shard::GathererOptions{rt.gather_comm.get(), rt.gather_stream.get(), cfg.param_dtype, rt.shard_rank, &progress.timeline,
                             &progress.exposed_comm_ns});
  return absl::OkStatus();
}

absl::Status Engine::Impl::EnsureGathered(int unit) {
  return cfg.stage == 3 ? gatherer->Ensure(unit) : absl::OkStatus();
}

void Engine::Impl::Prefetch(int current) {
  if (cfg.stage != 3 || cfg.prefetch_depth <= 0 || !progress.in_micro_batch) return;
  // Gathers along the recorded schedule; with NVMe shards, reads further ahead, as far as free buffers allow.
  gatherer->Prefetch(schedule->Upcoming(cfg.prefetch_depth, current),
                     schedule->Upcoming(gatherer->read_ahead_depth(), current));
}

void Engine::Impl::ReleaseParams(int unit) {
  if (cfg.stage != 3 || units[unit].active > 0) return;
  // Host compute is synchronous: the slot's last reader has finished, so no fence is needed.
  gatherer->Release(unit);
}

absl::Status Engine::Impl::SetUpReducer(const shard::SlotPlan& slots, size_t largest_shard) {
  std::vector<shard::ReduceUnit> reduced;
  for (UnitState& u : units) {
    reduced.push_back({u.layout.name, u.layout.total_elems, u.layout.shard_elems, u.grads.as<float>()});
  }
  const shard::ReducerEnv env{rt.reduce_comm.get(), rt.reduce_stream.get(), rt.device, &progress.timeline, &progress.exposed_comm_ns,
                              rt.replica_comm.get()};
  if (cfg.stage <= 1) {  // full gradients accumulate locally; one all-reduce on the last micro-batch
    reducer = shard::MakeAllReduceReducer(std::move(reduced), env);
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(shard::SlotPool pool, shard::SlotPool::Create(*rt.device_alloc, slots, 4, memory::Kind::kGradWorking,
                                                                      GradAlignment(rt.device_alloc.get())));
  STRATA_ASSIGN_OR_RETURN(memory::Buffer scratch,
                          rt.device_alloc->Allocate(largest_shard * 4, memory::Kind::kScratch, GradAlignment(rt.device_alloc.get())));
  memory::Buffer staging;
  if (GradStagingNeeded()) {
    STRATA_ASSIGN_OR_RETURN(staging, rt.host_alloc->Allocate(largest_shard * 4, memory::Kind::kScratch));
  }
  shard::ReduceOps ops{
      [this](void* p, size_t bytes) { return rt.device_ops->Zero(p, bytes); },
      [shards = &OptimizerOps()](device::Stream& s, float* grads, const float* src, size_t n) {  // the shards' tier
        shards->AccumulateOn(s, grads, src, n);
      },
      [this](device::Stream& s, void* host, const void* dev, size_t bytes) { rt.device_ops->ToHostOn(s, host, dev, bytes); }};
  if (!place.grad_shards) ops.accumulate = nullptr;  // the update in backward reads the reduced shard itself
  reducer = shard::MakeReduceScatterReducer(std::move(reduced), env, std::move(ops), std::move(pool), std::move(scratch),
                                            std::move(staging));
  return absl::OkStatus();
}

// ---- public hooks ----

namespace {
// A failure after state may have changed (a collective, the schedule, a pool) poisons the engine, so later
// hooks report the first cause instead of running on inconsistent state. Misuse caught before any change
// is returned without poisoning.
absl::Status Guard(Engine::Impl& m, absl::Status s) {
  if (!s.ok() && m.progress.failed.empty()) m.progress.failed = std::string(s.message());
  return s;
}
}  // namespace

absl::Status Engine::BeginMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "BeginMicroBatch"));
  if (m.progress.in_micro_batch) return absl::FailedPreconditionError("BeginMicroBatch() inside an open micro-batch");
  if (m.progress.micro_batch >= m.cfg.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("BeginMicroBatch(): ", m.progress.micro_batch, " micro-batches done and "
                                                      "gradient_accumulation_steps=", m.cfg.gradient_accumulation_steps,
                                                      "; call Step() first"));
  }
  for (UnitState& u : m.units) u.forward_uses = u.backward_uses = 0;
  m.progress.in_micro_batch = true;
  return absl::OkStatus();
}

absl::Status Engine::EndMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "EndMicroBatch"));
  if (!m.progress.in_micro_batch) return absl::FailedPreconditionError("EndMicroBatch() without BeginMicroBatch()");
  for (UnitState& u : m.units) {
    if (u.active > 0) {
      return Guard(m, absl::FailedPreconditionError(absl::StrCat("EndMicroBatch(): unit '", u.layout.name,
                                                                 "' was begun but not ended")));
    }
    if (u.forward_uses != u.backward_uses) {
      return Guard(m, absl::FailedPreconditionError(absl::StrCat(
                          "EndMicroBatch(): unit '", u.layout.name, "' had ", u.forward_uses, " forward but ",
                          u.backward_uses, " backward uses; every forward use needs its backward")));
    }
  }
  STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->EndMicroBatch()));
  m.progress.in_micro_batch = false;
  ++m.progress.micro_batch;
  return absl::OkStatus();
}

absl::Status Engine::BeginForward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "BeginForward"));
  UnitState& u = m.units[unit];
  if (m.progress.in_micro_batch) {
    if (u.backward_uses > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("BeginForward('", u.layout.name, "') after its backward began in this micro-batch"));
    }
    STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->Observe(Phase::kForward, unit)));
    ++u.forward_uses;
  }
  STRATA_RETURN_IF_ERROR(Guard(m, m.IssueGatherIfNeeded(unit)));
  m.Prefetch(unit);
  STRATA_RETURN_IF_ERROR(Guard(m, m.EnsureGathered(unit)));
  ++u.active;
  u.compute_start_ns = device::NowNs();
  return absl::OkStatus();
}

absl::Status Engine::EndForward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "EndForward"));
  UnitState& u = m.units[unit];
  if (u.active == 0) {
    return absl::FailedPreconditionError(absl::StrCat("EndForward('", u.layout.name, "') without BeginForward"));
  }
  --u.active;
  const int64_t now = device::NowNs();
  m.progress.compute_ns += now - u.compute_start_ns;
  m.progress.timeline.Add(device::Span{"compute", "forward", unit, u.compute_start_ns, now});
  if (m.cfg.reshard_after_forward || !m.progress.in_micro_batch) m.ReleaseParams(unit);
  return absl::OkStatus();
}

absl::Status Engine::BeginBackward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "BeginBackward"));
  UnitState& u = m.units[unit];
  if (!m.progress.in_micro_batch) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginBackward('", u.layout.name, "') outside a micro-batch (call BeginMicroBatch)"));
  }
  if (u.backward_uses >= u.forward_uses) {
    return absl::FailedPreconditionError(absl::StrCat("BeginBackward('", u.layout.name, "'): ", u.backward_uses + 1,
                                                      " backward uses but only ", u.forward_uses,
                                                      " forward uses in this micro-batch"));
  }
  STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->Observe(Phase::kBackward, unit)));
  ++u.backward_uses;
  STRATA_RETURN_IF_ERROR(Guard(m, m.IssueGatherIfNeeded(unit)));
  m.Prefetch(unit);
  if (!u.frozen()) STRATA_RETURN_IF_ERROR(Guard(m, m.reducer->Acquire(unit)));  // Note [Frozen units]
  STRATA_RETURN_IF_ERROR(Guard(m, m.EnsureGathered(unit)));
  ++u.active;
  u.compute_start_ns = device::NowNs();
  return absl::OkStatus();
}

absl::Status Engine::EndBackward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "EndBackward"));
  UnitState& u = m.units[unit];
  if (u.active == 0) {
    return absl::FailedPreconditionError(absl::StrCat("EndBackward('", u.layout.name, "') without BeginBackward"));
  }
  --u.active;
  const int64_t now = device::NowNs();
  m.progress.compute_ns += now - u.compute_start_ns;
  m.progress.timeline.Add(device::Span{"compute", "backward", unit, u.compute_start_ns, now});
  const bool last_use = u.backward_uses == u.forward_uses && !u.frozen();  // a frozen unit reduces nothing
  if (last_use && m.reducer->reduces(m.last_micro_batch())) {
    STRATA_RETURN_IF_ERROR(Guard(m, m.cfg.optimizer_in_backward ? m.ReduceAndUpdate(unit) : m.reducer->Reduce(unit)));
  }
  m.ReleaseParams(unit);
  return absl::OkStatus();
}

}  // namespace strata::engine
