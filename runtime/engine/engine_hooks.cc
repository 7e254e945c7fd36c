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

// Appends a span for the work enqueued on `s` since `start` was stamped (stamped by an earlier task).
// Stamps and spans are stream tasks (host functions on CUDA), so nothing is enqueued while the timeline
// is off: Stamp then gives nullptr.
void Engine::Impl::Span(device::Stream& s, const char* kind, int unit, std::shared_ptr<int64_t> start) {
  if (start == nullptr) return;
  s.Enqueue([this, kind, unit, start, name = std::string(s.name())]() {
    timeline.Add(device::Span{name, kind, unit, *start, device::NowNs()});
    return absl::OkStatus();
  });
}

namespace {
std::shared_ptr<int64_t> Stamp(device::Timeline& timeline, device::Stream& s) {
  if (!timeline.enabled()) return nullptr;
  auto start = std::make_shared<int64_t>(0);
  s.Enqueue([start]() {
    *start = device::NowNs();
    return absl::OkStatus();
  });
  return start;
}
}  // namespace

absl::Status Engine::Impl::IssueGather(int unit, bool demand) {
  UnitState& u = units[unit];
  const int slot = param_pool.TryAcquire(unit);
  if (slot < 0) {
    if (!demand) return absl::OkStatus();  // prefetch only when a slot is free
    std::vector<std::string> live;
    for (int i = 0; i < param_pool.size(); ++i) live.push_back(units[param_pool.owner(i)].layout.name);
    return absl::ResourceExhaustedError(absl::StrCat(
        "unit '", u.layout.name, "' needs a gathered buffer but all strata.max_live_units=", param_pool.size(),
        " are held by units [", absl::StrJoin(live, ", "), "]; end a unit before beginning the next, or raise "
        "max_live_units"));
  }
  const void* src = u.params.data();
  offload::ShardCache::Lease lease;
  if (nvme_params()) {  // Note [NVMe params]: the gather sends from the pinned, cached shard
    absl::StatusOr<offload::ShardCache::Lease> l = PinParamShard(unit, demand);
    if (!l.ok() || l->empty()) {  // failed, or a read-ahead gather not issued yet
      param_pool.Release(slot, nullptr);
      return l.status();
    }
    lease = std::move(l).value();
    src = lease.data();
  }
  u.param_slot = slot;
  char* recv = static_cast<char*>(param_pool.view(slot).data);
  // Note [Staged gathers]: a host shard reaches a device-buffer communicator through its own block of
  // the gathered buffer, copied on the copy stream; the all-gather then runs in place.
  device::Stream& first = staged_gathers() ? *copy_stream : *gather_stream;
  if (device::Event* fence = param_pool.fence(slot)) first.WaitFor(*fence);
  if (!lease.empty() && !staged_gathers()) lease.ready().StreamWait(first);
  // The pinned buffer is free for eviction once the copy or the gather has read it.
  auto release = [&](device::Stream& s) {
    if (lease.empty()) return;
    s.Enqueue([lease = std::move(lease)]() mutable {
      lease.Reset();
      return absl::OkStatus();
    });
  };
  if (staged_gathers()) {
    char* own = recv + static_cast<size_t>(rank()) * u.layout.shard_elems * param_bytes();
    auto copy_start = Stamp(timeline, *copy_stream);
    device_ops->FromHostOn(*copy_stream, own, src, u.layout.shard_elems * param_bytes());
    Span(*copy_stream, "h2d", unit, copy_start);
    release(*copy_stream);
    // The slot's own event: re-recorded only after this gather completed (the slot was released), and
    // owned by the engine, because a CUDA event must not be destroyed inside a stream's host function.
    copy_stream->Record(*copied[slot]);
    gather_stream->WaitFor(*copied[slot]);
    src = own;
  }
  auto start = Stamp(timeline, *gather_stream);
  u.gather = gather_comm->AllGather(src, recv, u.layout.shard_elems, cfg.param_dtype, *gather_stream);
  Span(*gather_stream, "gather", unit, start);
  release(*gather_stream);
  return absl::OkStatus();
}

absl::Status Engine::Impl::ParamReadError(int unit, const absl::Status& cause) const {
  return Annotate(cause, absl::StrCat("reading the parameter shard of unit '", units[unit].layout.name, "'"));
}

absl::StatusOr<offload::ShardCache::Lease> Engine::Impl::PinParamShard(int unit, bool demand) {
  absl::StatusOr<offload::ShardCache::Lease> lease = param_cache->Pin(unit);
  if (!lease.ok()) return ParamReadError(unit, lease.status());
  if (!staged_gathers()) {
    units[unit].param_read = lease->ready();  // the gather stream waits for it; EnsureGathered reports its error
    return lease;
  }
  // The copy is enqueued once the shard is read, so no stream blocks on I/O (on CUDA a blocking host
  // function would hold back every stream's host functions). A read-ahead gather whose read is still
  // running waits: the read goes on, and a later prefetch or the demand gather finds the shard cached.
  if (!demand && !lease->ready().Done()) return offload::ShardCache::Lease();
  absl::Status read = TimedWait(exposed_io_ns, [&] { return lease->ready().Wait(); });
  if (!read.ok()) return ParamReadError(unit, read);
  return lease;
}

absl::Status Engine::Impl::EnsureGathered(int unit) {
  if (cfg.stage != 3) return absl::OkStatus();
  UnitState& u = units[unit];
  if (u.param_slot < 0) STRATA_RETURN_IF_ERROR(IssueGather(unit, /*demand=*/true));
  if (nvme_params()) {  // a read not hidden by read-ahead is exposed I/O, and its error comes first
    absl::Status read = TimedWait(exposed_io_ns, [&] { return u.param_read.Wait(); });
    u.param_read = offload::IoWork();
    if (!read.ok()) return ParamReadError(unit, read);
  }
  STRATA_RETURN_IF_ERROR(TimedWait([&] { return u.gather.Wait(); }));
  if (staged_gathers()) {  // a failed copy fails its own stream; the gather after it does not know
    absl::Status copy = copy_stream->status();
    if (!copy.ok()) return Annotate(copy, "copying parameter shards to the device");
  }
  return absl::OkStatus();
}

void Engine::Impl::Prefetch(int current) {
  if (cfg.stage != 3 || cfg.prefetch_depth <= 0 || !in_micro_batch) return;
  for (int next : schedule->Upcoming(cfg.prefetch_depth, current)) {
    // A failed read-ahead is dropped; the demand gather of that unit reports it.
    if (units[next].param_slot < 0) IssueGather(next, /*demand=*/false).IgnoreError();
  }
  if (nvme_params()) {  // read further ahead than the gathers, as far as free buffers allow
    for (int next : schedule->Upcoming(static_cast<int>(param_buffers->buffer_count()), current)) {
      param_cache->Prefetch(next);
    }
  }
}

void Engine::Impl::ReleaseParams(int unit) {
  UnitState& u = units[unit];
  if (cfg.stage != 3 || u.param_slot < 0 || u.active > 0) return;
  // Host compute is synchronous: the slot's last reader has finished, so no fence is needed.
  param_pool.Release(u.param_slot, nullptr);
  u.param_slot = -1;
  u.gather = comm::Work();
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
  auto start = Stamp(timeline, rs);
  if (cfg.stage <= 1) {
    // Full gradients accumulate locally; one all-reduce on the last micro-batch.
    last_reduce = reduce_comm->AllReduce(u.grads.data(), u.grads.data(), u.layout.total_elems, DType::kF32,
                                         comm::ReduceOp::kSum, rs);
    Span(rs, "all_reduce", unit, start);
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
  Span(rs, "reduce_scatter", unit, start);
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
