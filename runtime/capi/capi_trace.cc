// The C ABI's trace: strata_engine_trace_enable / strata_engine_write_trace over the runtime's trace
// recorder and writer (runtime/engine/trace.h), the same code `strata train --trace` uses. The engine's
// timeline records spans while enabled; each strata_engine_step moves them, with the tiers' bytes, into
// the recorder (RecordStepTrace), so a long run holds at most the recorder's cap, never the timeline's.
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/device/host_device.h"

namespace strata::capi {
namespace {

absl::Status TraceEnable(strata_engine* e, int32_t on) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  STRATA_RETURN_IF_ERROR(CheckBetweenSteps(e));
  e->engine->timeline().Take();  // spans from before (an earlier recording's tail) are not this one's
  if (on == 0) {
    e->engine->timeline().SetEnabled(false);
    e->trace.reset();
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (int u = 0; u < e->engine->num_units(); ++u) names.push_back(e->engine->layout(u).name);
  e->trace = std::make_unique<engine::TraceRecorder>(e->comm->comm->rank(), std::move(names));
  e->engine->timeline().SetEnabled(true);
  return absl::OkStatus();
}

absl::Status WriteTrace(strata_engine* e, const char* path) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  comm::Communicator& world = *e->comm->comm;
  if (world.device_buffers()) {
    return absl::FailedPreconditionError(
        "writing a trace needs a host communicator (MPI or in-process); this one takes device buffers (NCCL)");
  }
  if (e->trace_stream == nullptr) {
    device::HostDevice host;  // stateless: a host stream owns its thread and outlives the device object
    STRATA_ASSIGN_OR_RETURN(e->trace_stream, host.CreateStream("trace"));
  }
  // What only this rank knows is exchanged first (engine::WriteTrace): a rank that cannot take part makes
  // every rank return, none is left waiting in a collective the others skipped.
  absl::Status local = CheckBetweenSteps(e);
  if (local.ok() && e->trace == nullptr) {
    local = absl::FailedPreconditionError("no trace is being recorded (call strata_engine_trace_enable first)");
  }
  if (local.ok() && world.rank() == 0 && path == nullptr) local = NullArgument("path");
  return engine::WriteTrace(world, *e->trace_stream, e->trace.get(), path == nullptr ? std::string() : path, local);
}

}  // namespace

void RecordStepTrace(strata_engine& e) {
  if (e.trace == nullptr) return;
  e.trace->AddAll(e.engine->timeline().Take());
  e.trace->Memory(device::NowNs(), e.engine->memory_stats());
}

}  // namespace strata::capi

using namespace strata::capi;  // NOLINT: the entry points below are thin wrappers

strata_status strata_engine_trace_enable(strata_engine* engine, int32_t on) {
  return Call(__func__, [&] { return TraceEnable(engine, on); });
}

strata_status strata_engine_write_trace(strata_engine* engine, const char* path) {
  return Call(__func__, [&] { return WriteTrace(engine, path); });
}
