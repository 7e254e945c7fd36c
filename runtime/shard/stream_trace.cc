#include "runtime/shard/stream_trace.h"

#include <string>

namespace strata::shard {

std::shared_ptr<int64_t> Stamp(device::Timeline& timeline, device::Stream& s) {
  if (!timeline.enabled()) return nullptr;
  auto start = std::make_shared<int64_t>(0);
  s.Enqueue([start]() {
    *start = device::NowNs();
    return absl::OkStatus();
  });
  return start;
}

void AddSpan(device::Timeline& timeline, device::Stream& s, const char* kind, int unit,
             std::shared_ptr<int64_t> start) {
  if (start == nullptr) return;
  s.Enqueue([&timeline, kind, unit, start, name = std::string(s.name())]() {
    timeline.Add(device::Span{name, kind, unit, *start, device::NowNs()});
    return absl::OkStatus();
  });
}

}  // namespace strata::shard
