// Internals shared by the C ABI's translation units: the handle structs, the call wrapper that turns a
// Status (or a C++ exception, which must never cross the ABI) into a code plus the per-thread message,
// and the versioned-struct readers and writers (the rules are in strata.h, "Versioned structs").
// Not installed; nothing outside runtime/capi includes it except the capi tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/capi/strata.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/host_device.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/trace.h"

// The size of a struct's first (ABI version 1) layout: the end of its last version-1 field. It never
// changes when fields are appended.
#define STRATA_V1_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)nullptr)->last_field))

namespace strata::comm {
class MpiRuntime;
}

namespace strata::capi {

inline constexpr uint32_t kCommMagic = 0x5c0aa001;
inline constexpr uint32_t kEngineMagic = 0x5e0e0001;

// Records `s` as this thread's last error (prefixed with `fn`) and returns its code; OK clears it.
strata_status Record(const char* fn, const absl::Status& s);

// Runs `body` (returning absl::Status) as the C entry point `fn`: no exception escapes.
template <typename F>
strata_status Call(const char* fn, F&& body) noexcept {
  try {
    return Record(fn, body());
  } catch (const std::bad_alloc&) {  // host memory ran out inside the call: the caller may free some and retry
    return Record(fn, absl::ResourceExhaustedError(absl::StrCat(
                          fn, ": out of host memory (std::bad_alloc); lower the batch or the memory budgets, or check "
                          "the process's memory limit (ulimit -v)")));
  } catch (const std::exception& e) {
    return Record(fn, absl::InternalError(absl::StrCat("unexpected C++ exception: ", e.what())));
  } catch (...) {
    return Record(fn, absl::InternalError("unexpected C++ exception"));
  }
}

inline absl::Status NullArgument(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
}

// The header every versioned struct starts with.
struct VersionedHeader {
  uint32_t struct_size;
  uint32_t version;
};

// An error reported as STRATA_ERR_VERSION.
absl::Status VersionError(absl::string_view message);

// Checks the header of a caller's struct of type T whose first known layout has `min_size` bytes.
absl::Status CheckHeader(const void* p, size_t min_size, size_t known_size, const char* what, bool input);

// Reads a caller's input struct over `defaults` (fields the caller's older layout lacks keep them).
template <typename T>
absl::Status ReadVersioned(const T* in, size_t min_size, const char* what, T* out) {
  if (in == nullptr) return NullArgument(what);
  if (absl::Status s = CheckHeader(in, min_size, sizeof(T), what, /*input=*/true); !s.ok()) return s;
  std::memcpy(out, in, std::min<size_t>(in->struct_size, sizeof(T)));
  return absl::OkStatus();
}

// Checks an output struct before any work is done (so a bad one changes nothing).
template <typename T>
absl::Status CheckOutput(const T* out, size_t min_size, const char* what) {
  if (out == nullptr) return NullArgument(what);
  return CheckHeader(out, min_size, sizeof(T), what, /*input=*/false);
}

// Writes `full` into a caller's (already checked) output struct, keeping its struct_size.
template <typename T>
void WriteVersioned(T full, T* out) {
  const VersionedHeader h{out->struct_size, out->version};
  full.struct_size = h.struct_size;
  full.version = std::min<uint32_t>(h.version, STRATA_ABI_VERSION);
  std::memcpy(out, &full, std::min<size_t>(h.struct_size, sizeof(T)));
}

strata_dtype ToCDType(DType d);

}  // namespace strata::capi

struct strata_comm {
  uint32_t magic = strata::capi::kCommMagic;
  std::shared_ptr<strata::comm::MpiRuntime> mpi_runtime;  // set when Strata initialised MPI
  std::unique_ptr<strata::comm::Communicator> comm;
  int live_engines = 0;  // engines created on this communicator and not destroyed
};

// Per unit: the pointer arrays handed out by begin_forward / begin_backward, and the open uses.
struct strata_unit_state {
  std::vector<void*> params;
  std::vector<float*> grads;
  int open_forward = 0;
  int open_backward = 0;
};

// The time split of strata_stats (see strata.h for the definitions).
struct strata_step_clock {
  int64_t step_begin_ns = 0;  // 0: the first step has not started
  double last_ms[6] = {0, 0, 0, 0, 0, 0};  // step, compute, exposed comm, exposed I/O, optimizer, other
};

struct strata_engine {
  uint32_t magic = strata::capi::kEngineMagic;
  strata_comm* comm = nullptr;
  std::unique_ptr<strata::device::Device> device;  // host or CUDA; declared before `engine`: it must outlive it
  std::unique_ptr<strata::engine::Engine> engine;
  bool finalized = false;
  bool in_micro_batch = false;
  int micro_batches_done = 0;  // in the current step
  int open_uses = 0;           // units begun and not ended, over all units
  std::vector<strata_unit_state> units;
  strata_step_clock clock;
  std::string loaded_trainer_json;  // from the last load_checkpoint (strata.h states its lifetime)
  std::string config_json;          // strata_engine_config_json's, made once
  // strata_engine_trace_enable: the recording (null when off) and the host stream its collectives run on.
  std::unique_ptr<strata::engine::TraceRecorder> trace;
  std::unique_ptr<strata::device::Stream> trace_stream;
};

namespace strata::capi {

absl::Status CheckComm(const strata_comm* c);
absl::Status CheckEngine(const strata_engine* e);
// Unit ids, and (unit, param) pairs, that exist, before or after finalize. Every int32 is a possible id
// from the caller: no value is reserved as "no parameter" (INT32_MIN once was, and skipped the check).
absl::Status CheckRegisteredUnit(const strata_engine* e, int32_t unit);
absl::Status CheckRegistered(const strata_engine* e, int32_t unit, int32_t param);
// The same after finalize.
absl::Status CheckFinalizedUnit(const strata_engine* e, int32_t unit);
absl::Status CheckFinalizedParam(const strata_engine* e, int32_t unit, int32_t param);
// Checkpoints and traces: after finalize and between steps, with the hook-level state the engine does not
// see checked here too.
absl::Status CheckBetweenSteps(const strata_engine* e);
// Called by strata_engine_step when it returns: the step's spans and memory into the trace, if recording.
void RecordStepTrace(strata_engine& e);

// Reads and validates the caller's parameter specs of one unit as strata_engine_register_unit does (struct
// sizes and versions, names, ndim, shapes, init kinds) and lays them out for `world_size` ranks with checked
// arithmetic (shard::UnitLayout::Build): no engine needed, never aborts on any values. The fuzzers' entry
// point; `params` must point at num_params readable elements of params[0].struct_size bytes.
absl::StatusOr<std::vector<shard::ParamSpec>> ValidateUnitSpecs(const char* name, const strata_param_spec* params,
                                                                int32_t num_params, int world_size);

}  // namespace strata::capi
