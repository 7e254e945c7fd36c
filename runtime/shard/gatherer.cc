#include "runtime/shard/gatherer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/shard/stream_trace.h"

namespace strata::shard {

Gatherer::Gatherer(SlotPool pool, std::vector<GatherUnit> units, std::unique_ptr<ParamSource> source,
                   GathererOptions o)
    : pool_(std::move(pool)), units_(std::move(units)), source_(std::move(source)), o_(o),
      slot_(units_.size(), -1), work_(units_.size()) {}

Gatherer::~Gatherer() { source_->Drain(); }

absl::Status Gatherer::Issue(int unit, bool demand) {
  const int slot = pool_.TryAcquire(unit);
  if (slot < 0) {
    if (!demand) return absl::OkStatus();  // prefetch only when a slot is free
    std::vector<std::string> live;
    for (int owner : pool_.owners()) live.push_back(units_[owner].name);
    return absl::ResourceExhaustedError(absl::StrCat(
        "unit '", units_[unit].name, "' needs a gathered buffer but all strata.max_live_units=", pool_.limit(),
        " are held by units [", absl::StrJoin(live, ", "), "]; end a unit before beginning the next, or raise "
        "max_live_units"));
  }
  char* recv = static_cast<char*>(pool_.view(slot).data);
  const size_t n = units_[unit].shard_elems, bytes = n * DTypeBytes(o_.dtype);
  const GatherCtx ctx{unit, slot, demand, /*host_ready=*/false, o_.stream, pool_.fence(slot),
                      recv + static_cast<size_t>(o_.rank) * bytes, bytes};
  absl::StatusOr<const void*> src = source_->Prepare(ctx);
  if (!src.ok() || *src == nullptr) {  // failed, or a read-ahead gather not issued yet
    pool_.Release(slot, nullptr);
    return src.status();
  }
  slot_[unit] = slot;
  auto start = Stamp(*o_.timeline, *o_.stream);
  work_[unit] = o_.comm->AllGather(*src, recv, n, o_.dtype, *o_.stream);
  AddSpan(*o_.timeline, *o_.stream, "gather", unit, start);
  source_->Sent(ctx);
  return absl::OkStatus();
}

absl::Status Gatherer::Ensure(int unit) {
  if (slot_[unit] < 0) STRATA_RETURN_IF_ERROR(Issue(unit, /*demand=*/true));
  STRATA_RETURN_IF_ERROR(source_->Check(unit));
  const int64_t t0 = device::NowNs();
  absl::Status gather = work_[unit].Wait();
  *o_.exposed_comm_ns += device::NowNs() - t0;
  STRATA_RETURN_IF_ERROR(gather);
  return source_->CheckCopies();
}

void Gatherer::Prefetch(absl::Span<const int> upcoming, absl::Span<const int> read_ahead) {
  for (int next : upcoming) {
    if (slot_[next] < 0) Issue(next, /*demand=*/false).IgnoreError();
  }
  source_->ReadAhead(read_ahead);
}

void Gatherer::Release(int unit) {
  if (slot_[unit] < 0) return;
  pool_.Release(slot_[unit], nullptr);
  slot_[unit] = -1;
  work_[unit] = comm::Work();
}

}  // namespace strata::shard
