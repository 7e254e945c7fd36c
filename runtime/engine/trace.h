// Chrome trace (chrome://tracing, Perfetto) of a training run: per rank (pid) and per stream (tid) the
// gathers, compute per unit, gradient reductions, optimizer steps and data waits recorded by the engine's
// timeline and the trainer, plus per-tier memory as counter tracks. Each rank records its own events;
// WriteTrace gathers them to rank 0, which writes one file with all ranks on one time axis (the
// monotonic clock is shared by processes of one machine; across machines each rank keeps its own).
// It lives in the runtime so that every front end writes the same trace: `strata train --trace`, the C
// ABI (strata_engine_trace_enable / strata_engine_write_trace) and the examples.
//
// Names (unit names come from the caller) are written as JSON strings, escaped: the file always parses.
// Past max_events the recorder keeps the first ones and counts the rest in dropped().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/device/timeline.h"
#include "runtime/engine/engine.h"

namespace strata::engine {

class TraceRecorder {
 public:
  TraceRecorder(int rank, std::vector<std::string> unit_names, size_t max_events = 500000);
  void Add(const device::Span& span);
  void AddAll(const std::vector<device::Span>& spans);
  // Current bytes per tier as counter events at time `ns`.
  void Memory(int64_t ns, const MemoryStats& m);
  size_t dropped() const { return dropped_; }
  // This rank's events as comma-separated JSON objects, timestamps relative to `origin_ns`.
  std::string EventsJson(int64_t origin_ns) const;
  int64_t first_ns() const { return first_ns_; }

 private:
  struct Event {
    std::string name, cat, stream;
    int64_t start_ns, end_ns;
    bool counter;
    std::string args;  // JSON object text
  };
  void Push(Event e);
  int rank_;
  std::vector<std::string> unit_names_;
  size_t max_events_;
  size_t dropped_ = 0;
  int64_t first_ns_ = 0;
  std::vector<Event> events_;
};

// Collective: every rank calls it; rank 0 writes `path`. `local` is the caller's own precondition on this
// rank (rec may be null when it is an error). The ranks first agree that all can take part: a rank whose
// `local` is an error, or a rank 0 that cannot open `path`, makes every rank return an error after that
// first exchange (its own, or one naming the ranks that could not), so no rank is left in a collective
// the others skipped and nothing is written.
absl::Status WriteTrace(comm::Communicator& world, device::Stream& stream, const TraceRecorder* rec,
                        const std::string& path, absl::Status local = absl::OkStatus());

}  // namespace strata::engine
