// The staged parameter source (param_source.h, Note [Staged gathers] in param_source.h): a
// host shard reaches a device-buffer communicator through its own block of the gathered buffer, copied
// on the copy stream after the slot's fence; the gather stream waits for that copy and all-gathers in
// place. Prefetched gathers copy ahead the same way, so the copy of the next unit overlaps the current
// unit's compute and the gather before it. A failed copy fails the copy stream, which CheckCopies reports
// after the gather.
#include <utility>

#include "runtime/base/status.h"
#include "runtime/shard/param_source.h"
#include "runtime/shard/stream_trace.h"

namespace strata::shard {

namespace {

class StagedSource final : public ParamSource {
 public:
  StagedSource(std::unique_ptr<ParamSource> host, std::unique_ptr<device::Stream> copy_stream,
               memory::TierOps& device_ops, device::Timeline* timeline,
               std::vector<std::unique_ptr<device::Event>> copied)
      : host_(std::move(host)),
        copy_stream_(std::move(copy_stream)),
        device_ops_(device_ops),
        timeline_(timeline),
        copied_(std::move(copied)) {}

  absl::StatusOr<const void*> Prepare(const GatherCtx& ctx) override {
    GatherCtx on_copy = ctx;
    on_copy.stream = copy_stream_.get();
    on_copy.host_ready = true;
    STRATA_ASSIGN_OR_RETURN(const void* src, host_->Prepare(on_copy));
    if (src == nullptr) return nullptr;
    auto start = Stamp(*timeline_, *copy_stream_);
    device_ops_.FromHostOn(*copy_stream_, ctx.own, src, ctx.bytes);
    AddSpan(*timeline_, *copy_stream_, "h2d", ctx.unit, start);
    host_->Sent(on_copy);
    // The slot's own event: re-recorded only after this gather completed (the slot was released), and
    // owned here, because a CUDA event must not be destroyed inside a stream's host function.
    copy_stream_->Record(*copied_[ctx.slot]);
    ctx.stream->WaitFor(*copied_[ctx.slot]);
    return ctx.own;
  }

  absl::Status Check(int unit) override { return host_->Check(unit); }

  // A failed copy fails its own stream; the gather after it does not know.
  absl::Status CheckCopies() override {
    absl::Status copy = copy_stream_->status();
    return copy.ok() ? copy : Annotate(copy, "copying parameter shards to the device");
  }

  void ReadAhead(absl::Span<const int> upcoming) override { host_->ReadAhead(upcoming); }
  int read_ahead_depth() const override { return host_->read_ahead_depth(); }
  void Drain() override { copy_stream_->Synchronize().IgnoreError(); }

 private:
  std::unique_ptr<ParamSource> host_;
  std::unique_ptr<device::Stream> copy_stream_;
  memory::TierOps& device_ops_;  // the gathered buffer's tier
  device::Timeline* timeline_;
  std::vector<std::unique_ptr<device::Event>> copied_;  // per gathered slot: its copy is done
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParamSource>> MakeStagedSource(std::unique_ptr<ParamSource> host,
                                                              std::unique_ptr<device::Stream> copy_stream,
                                                              device::Device& device, int slots,
                                                              memory::TierOps& device_ops, device::Timeline* timeline) {
  std::vector<std::unique_ptr<device::Event>> copied;
  for (int i = 0; i < slots; ++i) {
    copied.push_back(device.CreateEvent());
    if (copied.back() == nullptr) return absl::InternalError("creating the staged gathers' events failed");
  }
  return std::make_unique<StagedSource>(std::move(host), std::move(copy_stream), device_ops, timeline,
                                        std::move(copied));
}

}  // namespace strata::shard
