// The in-memory and NVMe-cached parameter sources (param_source.h); the staged one is staged_source.cc.
#include "runtime/shard/param_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace strata::shard {

namespace {

class MemorySource final : public ParamSource {
 public:
  explicit MemorySource(std::vector<const void*> shards) : shards_(std::move(shards)) {}
  absl::StatusOr<const void*> Prepare(const GatherCtx& ctx) override {
    if (ctx.fence != nullptr) ctx.stream->WaitFor(*ctx.fence);
    return shards_[ctx.unit];
  }

 private:
  std::vector<const void*> shards_;
};

// Note [NVMe params]: the gather sends from the pinned, cached shard. Unstaged, the gather stream waits
// for the read and Check reports its error; staged (host_ready), the read is waited for on the host
// before the copy is enqueued, never inside a stream (a blocking CUDA host function holds back the host
// functions of every stream), and a read-ahead gather whose read is still running is not issued yet:
// the read goes on, and a later prefetch or the demand gather finds the shard cached.
class CachedSource final : public ParamSource {
 public:
  CachedSource(offload::ShardCache* cache, int read_ahead, SourceEnv env)
      : cache_(cache), read_ahead_(read_ahead), env_(std::move(env)), leases_(env_.unit_names.size()),
        reads_(env_.unit_names.size()) {}

  absl::StatusOr<const void*> Prepare(const GatherCtx& ctx) override {
    absl::StatusOr<offload::ShardCache::Lease> lease = cache_->Pin(ctx.unit);
    if (!lease.ok()) return ReadError(ctx.unit, lease.status());
    if (ctx.host_ready) {
      if (!ctx.demand && !lease->ready().Done()) return nullptr;
      const int64_t t0 = device::NowNs();
      absl::Status read = lease->ready().Wait();
      *env_.exposed_io_ns += device::NowNs() - t0;
      if (!read.ok()) return ReadError(ctx.unit, read);
    } else {
      reads_[ctx.unit] = lease->ready();
    }
    if (ctx.fence != nullptr) ctx.stream->WaitFor(*ctx.fence);
    if (!ctx.host_ready) lease->ready().StreamWait(*ctx.stream);
    leases_[ctx.unit] = *std::move(lease);
    return leases_[ctx.unit].data();
  }

  // The pinned buffer is free for eviction once the copy or the gather has read it.
  void Sent(const GatherCtx& ctx) override {
    ctx.stream->Enqueue([lease = std::move(leases_[ctx.unit])]() mutable {
      lease.Reset();
      return absl::OkStatus();
    });
  }

  // A read not hidden by read-ahead is exposed I/O, and its error comes first.
  absl::Status Check(int unit) override {
    const int64_t t0 = device::NowNs();
    absl::Status read = reads_[unit].Wait();
    *env_.exposed_io_ns += device::NowNs() - t0;
    reads_[unit] = offload::IoWork();
    return read.ok() ? read : ReadError(unit, read);
  }

  void ReadAhead(absl::Span<const int> upcoming) override {
    for (int next : upcoming) cache_->Prefetch(next);
  }
  int read_ahead_depth() const override { return read_ahead_; }

 private:
  absl::Status ReadError(int unit, const absl::Status& cause) const {
    return Annotate(cause, absl::StrCat("reading the parameter shard of unit '", env_.unit_names[unit], "'"));
  }

  offload::ShardCache* cache_;
  int read_ahead_;
  SourceEnv env_;
  std::vector<offload::ShardCache::Lease> leases_;  // held from Prepare until Sent
  std::vector<offload::IoWork> reads_;              // unstaged: the read the gather stream waits for
};

}  // namespace

std::unique_ptr<ParamSource> MakeMemorySource(std::vector<const void*> shards) {
  return std::make_unique<MemorySource>(std::move(shards));
}

std::unique_ptr<ParamSource> MakeCachedSource(offload::ShardCache* cache, int read_ahead, SourceEnv env) {
  return std::make_unique<CachedSource>(cache, read_ahead, std::move(env));
}

}  // namespace strata::shard
