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
  if (!finalized) return absl::FailedPreconditionError(absl::StrCat(hook, "(", unit, ") before Finalize()"));
  if (!failed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(hook, " after an earlier failure: ", failed));
  }
  if (unit < 0 || unit >= static_cast<int>(units.size())) {
    return absl::OutOfRangeError(absl::StrCat(hook, "(", unit, "): no such unit (", units.size(), " registered)"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::SetUpGatherer(int live, size_t largest) {
  STRATA_ASSIGN_OR_RETURN(shard::SlotPool pool, shard::SlotPool::Create(*device_alloc, live, largest * param_bytes(),
                                                                        memory::Kind::kGathered));
  std::vector<shard::GatherUnit> gathered;
  shard::SourceEnv env{{}, &exposed_io_ns};
  for (const UnitState& u : units) {
    gathered.push_back({u.layout.name, u.layout.shard_elems});
    env.unit_names.push_back(u.layout.name);
  }
  // Where the shards come from is decided here, once (shard/param_source.h).
  std::unique_ptr<shard::ParamSource> source =
      nvme_params() ? shard::MakeCachedSource(param_cache.get(), static_cast<int>(param_buffers->buffer_count()),
                                              std::move(env))
                    : shard::MakeMemorySource([this](int unit) -> const void* { return units[unit].params.data(); });
  if (cfg.offload_param.device != OffloadDevice::kNone && gather_comm->device_buffers()) {  // Note [Staged gathers]
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> copy_stream, device->CreateStream("h2d"));
    auto copy = [this](device::Stream& s, void* dst, const void* host, size_t bytes) {
      device_ops->FromHostOn(s, dst, host, bytes);
    };
    STRATA_ASSIGN_OR_RETURN(source, shard::MakeStagedSource(std::move(source), std::move(copy_stream), *device,
                                                            pool.size(), copy, &timeline));
  }
  gatherer = std::make_unique<shard::Gatherer>(
      std::move(pool), std::move(gathered), std::move(source),
      shard::GathererOptions{gather_comm.get(), gather_stream.get(), cfg.param_dtype, rank(), &timeline, &exposed_comm_ns});
  return absl::OkStatus();
}

absl::Status Engine::Impl::EnsureGathered(int unit) {
  return cfg.stage == 3 ? gatherer->Ensure(unit) : absl::OkStatus();
}

void Engine::Impl::Prefetch(int current) {
  if (cfg.stage != 3 || cfg.prefetch_depth <= 0 || !in_micro_batch) return;
  // Gathers along the recorded schedule; with NVMe shards, reads further ahead, as far as free buffers allow.
  gatherer->Prefetch(schedule->Upcoming(cfg.prefetch_depth, current),
                     schedule->Upcoming(gatherer->read_ahead_depth(), current));
}

void Engine::Impl::ReleaseParams(int unit) {
  if (cfg.stage != 3 || units[unit].active > 0) return;
  // Host compute is synchronous: the slot's last reader has finished, so no fence is needed.
  gatherer->Release(unit);
}

absl::Status Engine::Impl::AcquireGradSlot(int unit) {
  UnitState& u = units[unit];
  if (cfg.stage < 2 || u.grad_slot >= 0) return absl::OkStatus();
  const int slot = grad_pool.TryAcquire(unit);
  if (slot < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "unit '", u.layout.name, "' needs a gradient buffer but all strata.max_live_units=", grad_pool.size(),
        " are held by units still in backward (tied units hold theirs until their last use); raise max_live_units"));
  }
  u.grad_slot = slot;
  STRATA_RETURN_IF_ERROR(TimedWait([&] { return grad_slot_reduce[slot].Wait(); }));
  STRATA_RETURN_IF_ERROR(grad_pool.WaitFence(slot));  // the previous owner's reduce-scatter read it
  return device_ops->Zero(grad_pool.view(slot).data, u.layout.total_elems * 4);
}

absl::Status Engine::Impl::ReduceGrads(int unit) {
  UnitState& u = units[unit];
  device::Stream& rs = *reduce_stream;
  auto start = shard::Stamp(timeline, rs);
  if (cfg.stage <= 1) {
    // Full gradients accumulate locally; one all-reduce on the last micro-batch.
    last_reduce = reduce_comm->AllReduce(u.grads.data(), u.grads.data(), u.layout.total_elems, DType::kF32,
                                         comm::ReduceOp::kSum, rs);
    shard::AddSpan(timeline, rs, "all_reduce", unit, start);
    return absl::OkStatus();
  }
  float* working = static_cast<float*>(grad_pool.view(u.grad_slot).data);
  float* scratch = reduce_scratch.as<float>();
  last_reduce = reduce_comm->ReduceScatter(working, scratch, u.layout.shard_elems, DType::kF32, comm::ReduceOp::kSum, rs);
  grad_slot_reduce[u.grad_slot] = last_reduce;
  float* shard = u.grads.as<float>();
  const size_t n = u.layout.shard_elems;
  if (grad_staging.empty()) {
    OptimizerOps().AccumulateOn(rs, shard, scratch, n);
  } else {  // device scratch, host shard (offloaded optimizer on a GPU): through pinned staging
    device_ops->ToHostOn(rs, grad_staging.data(), scratch, n * 4);
    host_ops->AccumulateOn(rs, shard, grad_staging.as<float>(), n);
  }
  shard::AddSpan(timeline, rs, "reduce_scatter", unit, start);
  auto fence = std::shared_ptr<device::Event>(device->CreateEvent());
  if (fence == nullptr) return absl::InternalError(absl::StrCat("creating the gradient fence of unit '", u.layout.name, "' failed"));
  rs.Record(*fence);
  grad_pool.Release(u.grad_slot, std::move(fence));
  u.grad_slot = -1;
  return absl::OkStatus();
}

// ---- public hooks ----

namespace {
// A failure after state may have changed (a collective, the schedule, a pool) poisons the engine, so later
// hooks report the first cause instead of running on inconsistent state. Misuse caught before any change
// is returned without poisoning.
absl::Status Guard(Engine::Impl& m, absl::Status s) {
  if (!s.ok() && m.failed.empty()) m.failed = std::string(s.message());
  return s;
}
}  // namespace

absl::Status Engine::BeginMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "BeginMicroBatch"));
  if (m.in_micro_batch) return absl::FailedPreconditionError("BeginMicroBatch() inside an open micro-batch");
  if (m.micro_batch >= m.cfg.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("BeginMicroBatch(): ", m.micro_batch, " micro-batches done and "
                                                      "gradient_accumulation_steps=", m.cfg.gradient_accumulation_steps,
                                                      "; call Step() first"));
  }
  for (UnitState& u : m.units) u.forward_uses = u.backward_uses = 0;
  m.in_micro_batch = true;
  return absl::OkStatus();
}

absl::Status Engine::EndMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "EndMicroBatch"));
  if (!m.in_micro_batch) return absl::FailedPreconditionError("EndMicroBatch() without BeginMicroBatch()");
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
  m.in_micro_batch = false;
  ++m.micro_batch;
  return absl::OkStatus();
}

absl::Status Engine::BeginForward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "BeginForward"));
  UnitState& u = m.units[unit];
  if (m.in_micro_batch) {
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
  m.compute_ns += now - u.compute_start_ns;
  m.timeline.Add(device::Span{"compute", "forward", unit, u.compute_start_ns, now});
  if (m.cfg.reshard_after_forward || !m.in_micro_batch) m.ReleaseParams(unit);
  return absl::OkStatus();
}

absl::Status Engine::BeginBackward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "BeginBackward"));
  UnitState& u = m.units[unit];
  if (!m.in_micro_batch) {
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
  STRATA_RETURN_IF_ERROR(Guard(m, m.AcquireGradSlot(unit)));
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
  m.compute_ns += now - u.compute_start_ns;
  m.timeline.Add(device::Span{"compute", "backward", unit, u.compute_start_ns, now});
  const bool last_use = u.backward_uses == u.forward_uses;
  if (last_use && (m.cfg.stage >= 2 || m.last_micro_batch())) STRATA_RETURN_IF_ERROR(Guard(m, m.ReduceGrads(unit)));
  m.ReleaseParams(unit);
  return absl::OkStatus();
}

}  // namespace strata::engine
