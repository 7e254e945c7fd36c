// Timeline spans of work enqueued on a stream: a stamp task marks the start, a span task after the work
// appends the span. Both are stream tasks (host functions on CUDA), so nothing is enqueued while the
// timeline is off: Stamp then gives nullptr and AddSpan does nothing.
#pragma once

#include <memory>

#include "runtime/device/device.h"
#include "runtime/device/timeline.h"

namespace strata::shard {

// Enqueues on `s` a task that records when the stream reaches it; nullptr while the timeline is off.
std::shared_ptr<int64_t> Stamp(device::Timeline& timeline, device::Stream& s);

// Enqueues on `s` a task that appends the span from `start` (a Stamp on `s`) to now, named by the stream.
void AddSpan(device::Timeline& timeline, device::Stream& s, const char* kind, int unit, std::shared_ptr<int64_t> start);

}  // namespace strata::shard
