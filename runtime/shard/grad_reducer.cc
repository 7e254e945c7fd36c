#include "runtime/shard/grad_reducer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/shard/stream_trace.h"

namespace strata::shard {

absl::Status GradReducer::TimedWait(const comm::Work& w) {
  const int64_t t0 = device::NowNs();
  absl::Status s = w.Wait();
  *env_.exposed_comm_ns += device::NowNs() - t0;
  return s;
}

absl::Status GradReducer::Finish() {
  const int64_t t0 = device::NowNs();
  absl::Status s = last_.Wait();  // the communicator's deadline; then the rest of the stream
  if (s.ok()) s = env_.stream->Synchronize();
  s = Annotate(s, "gradient reduction");
  *env_.exposed_comm_ns += device::NowNs() - t0;
  if (s.ok()) last_ = comm::Work();
  return s;
}

namespace {

class AllReduceReducer final : public GradReducer {
 public:
  AllReduceReducer(std::vector<ReduceUnit> units, ReducerEnv env) : GradReducer(std::move(units), env) {}
  bool reduces(bool last_micro_batch) const override { return last_micro_batch; }
  absl::Status Acquire(int) override { return absl::OkStatus(); }
  float* working(int unit) const override { return units_[unit].grads; }
  absl::Status Reduce(int unit) override {
    device::Stream& rs = *env_.stream;
    auto start = Stamp(*env_.timeline, rs);
    const ReduceUnit& u = units_[unit];
    last_ = env_.comm->AllReduce(u.grads, u.grads, u.total_elems, DType::kF32, comm::ReduceOp::kSum, rs);
    AddSpan(*env_.timeline, rs, "all_reduce", unit, start);
    return absl::OkStatus();
  }
};

class ReduceScatterReducer final : public GradReducer {
 public:
  ReduceScatterReducer(std::vector<ReduceUnit> units, ReducerEnv env, ReduceOps ops, SlotPool pool,
                       memory::Buffer scratch, memory::Buffer staging)
      : GradReducer(std::move(units), env), ops_(std::move(ops)), pool_(std::move(pool)),
        scratch_(std::move(scratch)), staging_(std::move(staging)), slot_(units_.size(), -1),
        slot_reduce_(pool_.size()) {}

  bool reduces(bool) const override { return true; }

  absl::Status Acquire(int unit) override {
    if (slot_[unit] >= 0) return absl::OkStatus();
    const int slot = pool_.TryAcquire(unit);
    if (slot < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "unit '", units_[unit].name, "' needs a gradient buffer but all strata.max_live_units=", pool_.limit(),
          " are held by units still in backward (tied units hold theirs until their last use); raise max_live_units"));
    }
    slot_[unit] = slot;
    STRATA_RETURN_IF_ERROR(TimedWait(slot_reduce_[slot]));
    STRATA_RETURN_IF_ERROR(pool_.WaitFence(slot));  // the previous owner's reduce-scatter read it
    return ops_.working->Zero(pool_.view(slot).data, units_[unit].total_elems * 4);
  }

  float* reduced() const override { return reduced_; }

  float* working(int unit) const override {
    return slot_[unit] < 0 ? nullptr : static_cast<float*>(pool_.view(slot_[unit]).data);
  }

  absl::Status Reduce(int unit) override {
    const ReduceUnit& u = units_[unit];
    device::Stream& rs = *env_.stream;
    auto start = Stamp(*env_.timeline, rs);
    float* scratch = scratch_.as<float>();
    const size_t n = u.shard_elems;
    last_ = env_.comm->ReduceScatter(working(unit), scratch, n, DType::kF32, comm::ReduceOp::kSum, rs);
    slot_reduce_[slot_[unit]] = last_;  // the slot is free once the reduce-scatter has read it
    const char* span = "reduce_scatter";  // the span that ends after the shard is added
    if (env_.replica_comm != nullptr) {
      AddSpan(*env_.timeline, rs, span, unit, start);
      start = Stamp(*env_.timeline, rs);
      last_ = env_.replica_comm->AllReduce(scratch, scratch, n, DType::kF32, comm::ReduceOp::kSum, rs);
      span = "replica_all_reduce";
    }
    float* shard = scratch;
    if (!staging_.empty()) {  // device scratch, host shard (offloaded optimizer on a GPU): through pinned staging
      ops_.working->ToHostOn(rs, staging_.data(), scratch, n * 4);
      shard = staging_.as<float>();
    }
    if (ops_.shards != nullptr) {
      ops_.shards->AccumulateOn(rs, u.grads, shard, n);
    } else {
      reduced_ = shard;  // the caller consumes it (the update in backward)
    }
    AddSpan(*env_.timeline, rs, span, unit, start);
    auto fence = std::shared_ptr<device::Event>(env_.device->CreateEvent());
    if (fence == nullptr)
      return absl::InternalError(absl::StrCat("creating the gradient fence of unit '", u.name, "' failed"));
    rs.Record(*fence);
    pool_.Release(slot_[unit], std::move(fence));
    slot_[unit] = -1;
    return absl::OkStatus();
  }

  void ReleaseIdle() override {
    pool_.ReleaseIdle();
    // Without gradient shards the scratch held the last reduced shard for the caller (reduced()), who has
    // read it by now (the contract): every reduction writes the scratch whole before it is read again.
    scratch_.DiscardToZero();
  }

 private:
  ReduceOps ops_;
  SlotPool pool_;
  memory::Buffer scratch_;  // one shard of the largest unit, used in reduce-stream order
  memory::Buffer staging_;  // pinned host copy of scratch_, or empty; reduce-stream order
  std::vector<int> slot_;   // per unit: its working buffer, or -1
  std::vector<comm::Work> slot_reduce_;  // per slot: the reduce-scatter that last read it
  float* reduced_ = nullptr;             // without accumulate: where the last reduction's shard is
};

}  // namespace

std::unique_ptr<GradReducer> MakeAllReduceReducer(std::vector<ReduceUnit> units, ReducerEnv env) {
  return std::make_unique<AllReduceReducer>(std::move(units), env);
}

std::unique_ptr<GradReducer> MakeReduceScatterReducer(std::vector<ReduceUnit> units, ReducerEnv env, ReduceOps ops,
                                                      SlotPool pool, memory::Buffer scratch, memory::Buffer staging) {
  return std::make_unique<ReduceScatterReducer>(std::move(units), env, std::move(ops), std::move(pool),
                                                std::move(scratch), std::move(staging));
}

}  // namespace strata::shard
