// Per-unit hooks: the engine checks the micro-batch and the agreed schedule, each unit its own transitions
// (Note [Unit protocol]), and hands the unit to its owners, chosen at Finalize (Note [Unit owners],
// engine_owners.cc): the stage's parameter owner (gathers with prefetch at stage 3), the unit's gradient
// owner (none when frozen) and the update owner. See engine.h for the protocol and Note [Gather buffer
// reuse] in shard/slot_pool.h for buffer reuse.
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
  for (UnitState& u : m.units) u.protocol.BeginMicroBatch();
  m.progress.in_micro_batch = true;
  return absl::OkStatus();
}

absl::Status Engine::EndMicroBatch() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(0, "EndMicroBatch"));
  if (!m.progress.in_micro_batch) return absl::FailedPreconditionError("EndMicroBatch() without BeginMicroBatch()");
  for (UnitState& u : m.units) STRATA_RETURN_IF_ERROR(Guard(m, u.protocol.CheckMicroBatchEnd(u.layout.name)));
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
  ParamsOwner& params = *m.owners.params;
  if (m.progress.in_micro_batch) {
    STRATA_RETURN_IF_ERROR(u.protocol.CheckPreForward(u.layout.name));
    if (!m.schedule->recorded()) STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(1, unit)));  // Note [Agreed schedule]
    STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->Observe(Phase::kForward, unit)));
    u.protocol.CountForward();
  } else {
    STRATA_RETURN_IF_ERROR(Guard(m, params.EvaluationUse(unit)));
  }
  STRATA_RETURN_IF_ERROR(Guard(m, params.Issue(unit)));
  if (m.progress.in_micro_batch) params.Prefetch(unit);
  STRATA_RETURN_IF_ERROR(Guard(m, params.Ensure(unit)));
  u.protocol.BeginCompute(device::NowNs());
  return absl::OkStatus();
}

absl::Status Engine::EndForward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "EndForward"));
  UnitState& u = m.units[unit];
  STRATA_ASSIGN_OR_RETURN(const int64_t start, u.protocol.PostForward(u.layout.name));
  const int64_t now = device::NowNs();
  m.progress.compute_ns += now - start;
  m.progress.timeline.Add(device::Span{"compute", "forward", unit, start, now});
  if ((m.cfg.reshard_after_forward || !m.progress.in_micro_batch) && u.protocol.idle()) m.owners.params->Reshard(unit);
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
  STRATA_RETURN_IF_ERROR(u.protocol.CheckPreBackward(u.layout.name));
  if (!m.schedule->recorded()) STRATA_RETURN_IF_ERROR(Guard(m, m.AgreeOnUse(2, unit)));  // Note [Agreed schedule]
  STRATA_RETURN_IF_ERROR(Guard(m, m.schedule->Observe(Phase::kBackward, unit)));
  u.protocol.CountBackward();
  ParamsOwner& params = *m.owners.params;
  STRATA_RETURN_IF_ERROR(Guard(m, params.Issue(unit)));
  params.Prefetch(unit);  // (a backward is always in a micro-batch)
  // The working gradient buffer; a frozen unit takes none.
  STRATA_RETURN_IF_ERROR(Guard(m, u.grad->PreBackward(unit)));
  STRATA_RETURN_IF_ERROR(Guard(m, params.Ensure(unit)));
  u.protocol.BeginCompute(device::NowNs());
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
  u.grad->MarkNoGrad(u, param, m.progress.micro_batch);
  return absl::OkStatus();
}

absl::Status Engine::EndBackward(int unit) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckUnit(unit, "EndBackward"));
  UnitState& u = m.units[unit];
  STRATA_ASSIGN_OR_RETURN(const int64_t start, u.protocol.PostBackward(u.layout.name));
  const int64_t now = device::NowNs();
  m.progress.compute_ns += now - start;
  m.progress.timeline.Add(device::Span{"compute", "backward", unit, start, now});
  // The gradient is complete: the trained unit's reduction (and with it an update in backward).
  if (u.protocol.last_backward_use()) STRATA_RETURN_IF_ERROR(Guard(m, u.grad->LastBackwardUse(unit)));
  if (u.protocol.idle()) m.owners.params->Reshard(unit);
  return absl::OkStatus();
}

}  // namespace strata::engine
