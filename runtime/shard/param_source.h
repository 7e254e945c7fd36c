// Where the parameter shard a stage-3 gather sends comes from (shard::Gatherer). Each placement is one
// implementation, picked once when the engine is finalized, so the gather itself never asks where the
// shard lives:
//   MemorySource  the shard is in memory the communicator can send from (device, or host on host devices);
//   CachedSource  the shard lives on NVMe behind an offload::ShardCache (Note [NVMe params]
//                 below): pinned for the gather, read when not cached;
//   StagedSource  wraps a host source for a communicator that takes device buffers only (NCCL): the
//                 shard is first copied into this rank's block of the gathered buffer (Note [Staged
//                 gathers] below), and the all-gather runs in place.
//
// Protocol, per gather: Prepare (orders ctx.gather after whatever the send needs, the slot's fence
// included, and returns where the all-gather sends from), the all-gather is enqueued on ctx.gather, then
// Sent (releases what Prepare held once the gather has read it). Before compute reads the unit: Check
// (the error of a read the gather waited for comes first), the gather's own wait, then CheckCopies.
//
// Note [NVMe params]. With offload_param = nvme (stage 3 only) each unit's parameter shard lives in an
// NVMe extent behind an offload::ShardCache of pinned buffers (no u.params). A gather pins the shard
// (reading it when not cached), the gather stream waits for the read, all-gathers from the pinned
// buffer and then releases it. Prefetch reads the shards of the next units of the recorded schedule
// ahead of their gathers, as far as free buffers allow (offload_param.buffer_count, at least one more
// than the gathered units that can be live). Whatever writes the shard (initialisation, the update's
// cast, SetParam, a restore) writes the cache and NVMe through. The fp32
// master is then always a separate buffer.
//
// Note [Staged gathers]. With offload_param (cpu or nvme) the rank's parameter shard is in host memory;
// a communicator that takes device buffers (NCCL) cannot send it. Each gather then first copies the
// shard into the rank's own block of the gathered buffer on the h2d copy stream (after the slot's
// fence; the cache lease is released after the copy), and the gather stream waits for that copy and
// all-gathers in place. Prefetched gathers copy ahead the same way, so the copy of the next unit overlaps
// the current unit's compute and the gather before it. An NVMe read is waited for on the host before its
// copy is enqueued, never inside a stream (a blocking CUDA host function holds back the host functions
// of every stream): a demand gather waits (exposed I/O), a read-ahead gather whose read is still running
// is not issued yet. A failed copy fails the copy stream, which Gatherer::Ensure checks after the gather.
// (staged_source.cc; the copy stream is the staged source's.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/device/device.h"
#include "runtime/device/timeline.h"
#include "runtime/memory/tier_ops.h"
#include "runtime/offload/shard_cache.h"

namespace strata::shard {

// One gather, as a source sees it.
struct GatherCtx {
  int unit = 0;
  int slot = 0;             // the gathered buffer's slot
  bool demand = true;       // false: a read-ahead gather, which a source may postpone
  bool host_ready = false;  // the shard must be in host memory on return (a staged copy reads it next)
  device::Stream* stream = nullptr;  // where the send (or the staged copy) is enqueued next
  device::Event* fence = nullptr;    // the slot's fence (may be null): the first write waits for it
  char* own = nullptr;      // this rank's block of the gathered buffer
  size_t bytes = 0;         // the shard's bytes
};

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // Where the all-gather of ctx.unit sends from, or nullptr: a read-ahead gather not to issue yet.
  virtual absl::StatusOr<const void*> Prepare(const GatherCtx& ctx) = 0;
  // After the send of ctx.unit was enqueued on ctx.stream: releases what Prepare held, in stream order.
  virtual void Sent(const GatherCtx& ctx) {}
  // Before compute reads the gathered unit: waits for (and reports) a read the gather stream waited for.
  virtual absl::Status Check(int unit) { return absl::OkStatus(); }
  // After the unit's gather completed: the error of a copy that ran before it.
  virtual absl::Status CheckCopies() { return absl::OkStatus(); }
  // Reads ahead the shards of `upcoming` (in order), as far as the source can without blocking.
  virtual void ReadAhead(absl::Span<const int> upcoming) {}
  // How many units ahead ReadAhead is worth calling for (0: never).
  virtual int read_ahead_depth() const { return 0; }
  // Waits for the work the source enqueued on streams of its own (before buffers go away).
  virtual void Drain() {}
};

// Shards in memory: shards[unit] is where unit's shard starts (fixed once the buffers are allocated).
std::unique_ptr<ParamSource> MakeMemorySource(std::vector<const void*> shards);

// What a source charges the time it waits for I/O to, and how it names units in errors.
struct SourceEnv {
  std::vector<std::string> unit_names;
  int64_t* exposed_io_ns = nullptr;
};

// Shards behind `cache` (one shard per unit); `read_ahead` buffers' worth of units are read ahead.
std::unique_ptr<ParamSource> MakeCachedSource(offload::ShardCache* cache, int read_ahead, SourceEnv env);

// `host` (whose shards are host memory) staged through `copy_stream` into the gathered buffer with
// `device_ops.FromHostOn` (the gathered buffer's tier, Note [Tier ops] in runtime/memory/tier_ops.h): one
// event per gathered slot (`slots`), created on `device`. `device_ops` must outlive the source.
absl::StatusOr<std::unique_ptr<ParamSource>> MakeStagedSource(std::unique_ptr<ParamSource> host,
                                                              std::unique_ptr<device::Stream> copy_stream,
                                                              device::Device& device, int slots,
                                                              memory::TierOps& device_ops, device::Timeline* timeline);

}  // namespace strata::shard
