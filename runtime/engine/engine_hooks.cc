// Per-unit hooks: gathers (stage 3, with prefetch along the recorded schedule), working gradient
// buffers and gradient reduction on the reduce stream. See engine.h for the protocol and
// Note [Gather buffer reuse] in shard/slot_pool.h for buffer reuse.
#include <algorithm>
#include <cstring>

#include "absl/strings/cord.h"
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
    return shard::MakeCachedSource(pstore.param_cache.get(), static_cast<int>(pstore.param_buffers->buffer_count()),
                                   std::move(env));
  }
  std::vector<const void*> shards;  // the units' buffers are allocated (Finalize) and stay where they are
  for (const UnitState& u : units) shards.push_back(u.params.data());
  return shard::MakeMemorySource(std::move(shards));
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
    STRATA_ASSIGN_OR_RETURN(source, shard::MakeStagedSource(std::move(source), std::move(copy_stream), *rt.device,
                                                            pool.size(), *rt.device_ops, &progress.timeline));
  }
  gatherer = std::make_unique<shard::Gatherer>(
      std::move(pool), std::move(gathered), std::move(source),
      shard::GathererOptions{rt.gather_comm.get(), rt.gather_stream.get(), cfg.param_dtype, rt.shard_rank,
                             &progress.timeline, &progress.exposed_comm_ns});
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
  const shard::ReducerEnv env{rt.reduce_comm.get(), rt.reduce_stream.get(),    rt.device,
                              &progress.timeline,   &progress.exposed_comm_ns, rt.replica_comm.get()};
  if (cfg.stage <= 1) {  // full gradients accumulate locally; one all-reduce on the last micro-batch
    reducer = shard::MakeAllReduceReducer(std::move(reduced), env);
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(shard::SlotPool pool,
                          shard::SlotPool::Create(*rt.device_alloc, slots, 4, memory::Kind::kGradWorking,
                                                  GradAlignment(rt.device_alloc.get())));
  STRATA_ASSIGN_OR_RETURN(memory::Buffer scratch, rt.device_alloc->Allocate(largest_shard * 4, memory::Kind::kScratch,
                                                                            GradAlignment(rt.device_alloc.get())));
  memory::Buffer staging;
  if (GradStagingNeeded()) {
    STRATA_ASSIGN_OR_RETURN(staging, rt.host_alloc->Allocate(largest_shard * 4, memory::Kind::kScratch));
  }
  // The working buffers are on the device tier, the gradient shards on the optimizer's; without shards the
  // update in backward reads the reduced shard itself.
  shard::ReduceOps ops{rt.device_ops.get(), place.grad_shards ? &OptimizerOps() : nullptr};
  reducer = shard::MakeReduceScatterReducer(std::move(reduced), env, std::move(ops), std::move(pool),
                                            std::move(scratch), std::move(staging));
  return absl::OkStatus();
}

namespace {
// Marks a failure every rank reaches alike (Poison sends no notice for it).
constexpr char kEveryRankFails[] = "strata.engine/every_rank_fails";
}  // namespace

void Engine::Impl::Poison(const absl::Status& cause) {
  if (cause.ok() || !progress.failed.empty()) return;
  progress.failed = std::string(cause.message());
  if (comm::IsPeerFailure(cause) || cause.GetPayload(kEveryRankFails).has_value()) return;
  const std::string text = absl::StrCat("its engine failed: ", cause.message());
  for (comm::Communicator* c : {rt.gather_comm.get(), rt.reduce_comm.get(), rt.step_comm.get(), rt.replica_comm.get(),
                                rt.control_comm.get(), rt.group_control_comm.get()}) {
    if (c != nullptr) c->NotifyFailure(absl::Status(cause.code(), text));
  }
}

void Engine::NotifyFailure(const absl::Status& cause) { impl_->Poison(cause); }

// Note [Agreed schedule]. Collectives pair up by order, so every rank must use the units in the same
// order: a rank whose forward takes another path (a task head per rank, experts routed differently, a
// layer dropped with a per-rank seed) would otherwise gather or reduce another unit than its peers, which
// silently swaps data between units of equal size and ends in a timeout blaming a live rank otherwise.
// The order is agreed in two parts (docs/decisions/0024-agreed-schedule.md):
//  - While the schedule is being recorded (the first micro-batch) and for every evaluation use at stage 3
//    (which gathers and records nothing), each use is compared across the ranks before any collective is
//    issued for it: an 8-byte all-gather on the control communicator. A difference fails every rank alike,
//    naming the use, what each rank was about to do and the remedy. So the recorded schedule is the same
//    on every rank.
//  - From then on each rank checks its uses against that record before issuing anything (Schedule::
//    Observe): no collective at all. A rank that deviates fails locally and its Poison tells the peers
//    (Note [Failure notices]), whose waits end within milliseconds naming it and its cause; prefetch only
//    ever issues gathers of the common record, so nothing mismatched is in flight.
// Cost: 2 x units small all-gathers once per engine (and one per evaluation use at stage 3); none per
// training micro-batch after the first.
absl::Status Engine::Impl::AgreeOnUse(int what, int unit) {
  comm::Communicator& c = *rt.control;
  if (c.size() == 1) return absl::OkStatus();
  const int64_t mine = (int64_t{what} << 32) | static_cast<uint32_t>(unit + 1);
  std::vector<int64_t> all(c.size());
  auto describe = [this](int64_t code) -> std::string {
    const int kind = static_cast<int>(code >> 32), u = static_cast<int>(code & 0xffffffff) - 1;
    if (kind == 0) return "the end of the micro-batch";
    const std::string name = u >= 0 && u < static_cast<int>(units.size()) ? units[u].layout.name : "?";
    const char* k = kind == 1 ? "forward" : kind == 2 ? "backward" : "evaluation forward";
    return absl::StrCat("the ", k, " of unit '", name, "'");
  };
  const bool eval = what == 3;
  absl::Status s = comm::AllGatherBytes(c, &mine, all.data(), sizeof(mine), *rt.control_stream).Wait();
  if (!s.ok()) {
    if (comm::IsPeerFailure(s)) return s;
    return absl::Status(s.code(), absl::StrCat(
        "agreeing with the other ranks on ", describe(mine), eval ?
        " (outside a training micro-batch, a forward of a model sharded at stage 3 gathers every unit from every "
        "rank: every rank must run the same evaluation forwards, e.g. generate() on every rank)" : "", ": ",
        s.message()));
  }
  if (std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == mine; })) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const auto& [code, ranks] : RanksByValue(all))
    parts.push_back(absl::StrCat(RanksText(ranks), ": ", describe(code)));
  // Some ranks evaluating (outside a micro-batch) while others train is not a model's path but a loop's.
  const bool mixed = std::any_of(all.begin(), all.end(), [](int64_t v) { return (v >> 32) == 3; }) &&
                     std::any_of(all.begin(), all.end(), [](int64_t v) { return (v >> 32) != 3; });
  const std::string remedy =
      mixed ? "Some ranks ran a forward outside a training micro-batch (evaluation, generate()) while others "
              "trained: at stage 3 every forward gathers each unit from every rank, so every rank must run the "
              "same evaluation forwards at the same point of the loop (or evaluate at a lower stage)"
            : "Every rank must use the same units in the same order, because each use gathers or reduces that "
              "unit with every rank. Make a module that runs on some ranks only (a per-rank head, an expert, a "
              "dropped layer) part of a unit that every rank runs, such as the root unit (strata.torch: "
              "unit_classes that exclude it), so that a rank which skips it contributes a zero gradient; or make "
              "every rank take the same path";
  absl::Status diverged = absl::FailedPreconditionError(absl::StrCat(
      "the ranks took different paths through the model ",
      eval ? std::string("in an evaluation forward") : absl::StrCat("at use #", schedule->position() + 1,
                                                                    " of the first micro-batch"),
      " (", absl::StrJoin(parts, "; "), "). ", remedy, " (docs/decisions/0024-agreed-schedule.md)"));
  // Every rank saw the same answers and fails alike: a notice would only race the others' own errors.
  diverged.SetPayload(kEveryRankFails, absl::Cord("1"));
  return diverged;
}

// ---- public hooks ----

namespace {
// A failure after state may have changed (a collective, the schedule, a pool) poisons the engine, so later
// hooks report the first cause instead of running on inconsistent state, and tells its peers (Poison).
// Misuse caught before any change is returned without poisoning.
absl::Status Guard(Engine::Impl& m, absl::Status s) {
  if (!s.ok()) m.Poison(s);
  return s;
}
}  // namespace

absl::Status Engine::BeginMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "BeginMicroBatch"));
  if (m.progress.in_micro_batch) return absl::FailedPreconditionError("BeginMicroBatch() inside an open micro-batch");
  if (m.progress.micro_batch >= m.cfg.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("BeginMicroBatch(): ", m.progress.micro_batch,
                                                      " micro-batches done and "
                                                      "gradient_accumulation_steps=",
                                                      m.cfg.gradient_accumulation_steps, "; call Step() first"));
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
  if (!m.schedule->recorded()) STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(0, -1)));  // Note [Agreed schedule]
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
    if (!m.schedule->recorded()) STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(1, unit)));  // Note [Agreed schedule]
    STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->Observe(Phase::kForward, unit)));
    ++u.forward_uses;
  } else if (m.cfg.stage == 3) {
    STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(3, unit)));  // an evaluation gather (Note [Agreed schedule])
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
  if (!m.schedule->recorded()) STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(2, unit)));  // Note [Agreed schedule]
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

absl::Status Engine::MarkNoGrad(int unit, int param) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "MarkNoGrad"));
  UnitState& u = m.units[unit];
  if (!m.progress.in_micro_batch) {
    return absl::FailedPreconditionError(absl::StrCat("MarkNoGrad('", u.layout.name, "') outside a micro-batch"));
  }
  if (param < 0 || param >= static_cast<int>(u.layout.params.size())) {
    return absl::OutOfRangeError(absl::StrCat("MarkNoGrad('", u.layout.name, "', ", param, "): no such parameter (",
                                              u.layout.params.size(), ")"));
  }
  if (u.frozen() || u.no_grad_marked_in[param] == m.progress.micro_batch) return absl::OkStatus();
  u.no_grad_marked_in[param] = m.progress.micro_batch;
  ++u.no_grad_micro_batches[param];
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
