// Status codes, the per-thread last-error message, versions, versioned-struct header checks and the
// handle checks shared by every entry point of the C ABI.
#include <cstring>
#include <string>

#include "absl/strings/cord.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/comm/communicator.h"

namespace strata::capi {
namespace {

// Marks a status as a versioned-struct error (STRATA_ERR_VERSION has no absl code of its own).
constexpr absl::string_view kVersionPayload = "strata.capi/version";

// The message of the last failed call on this thread: thread_local, so each thread (each in-process
// rank, each host thread) sees only its own calls. A fixed buffer, so the pointer strata_last_error()
// returns never dangles, even when read before the call whose error it reports (an unspecified order of
// evaluation of printf's arguments); longer messages are truncated.
constexpr size_t kMaxMessage = 4096;
char* LastError() {
  thread_local char message[kMaxMessage] = "";
  return message;
}

void SetLastError(absl::string_view text) {
  char* m = LastError();
  if (text.size() >= kMaxMessage) {
    std::memcpy(m, text.data(), kMaxMessage - 5);
    std::memcpy(m + kMaxMessage - 5, "...", 4);
    return;
  }
  std::memcpy(m, text.data(), text.size());
  m[text.size()] = '\0';
}

strata_status CodeOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return STRATA_OK;
    case absl::StatusCode::kInvalidArgument: return STRATA_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kFailedPrecondition: return STRATA_ERR_FAILED_PRECONDITION;
    case absl::StatusCode::kOutOfRange: return STRATA_ERR_OUT_OF_RANGE;
    case absl::StatusCode::kResourceExhausted: return STRATA_ERR_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kDeadlineExceeded: return STRATA_ERR_DEADLINE_EXCEEDED;
    case absl::StatusCode::kUnimplemented: return STRATA_ERR_UNIMPLEMENTED;
    case absl::StatusCode::kNotFound: return STRATA_ERR_NOT_FOUND;
    case absl::StatusCode::kAlreadyExists: return STRATA_ERR_ALREADY_EXISTS;
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied: return STRATA_ERR_IO;
    default: return STRATA_ERR_INTERNAL;
  }
}

}  // namespace

strata_status Record(const char* fn, const absl::Status& s) {
  if (s.ok()) {
    LastError()[0] = '\0';
    return STRATA_OK;
  }
  SetLastError(absl::StrCat(fn, ": ", s.message()));
  if (comm::IsPeerFailure(s)) return STRATA_ERR_PEER_FAILED;  // Note [Failure notices]
  return s.GetPayload(kVersionPayload).has_value() ? STRATA_ERR_VERSION : CodeOf(s.code());
}

absl::Status VersionError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kVersionPayload, absl::Cord("1"));
  return s;
}

absl::Status CheckHeader(const void* p, size_t min_size, size_t known_size, const char* what, bool input) {
  VersionedHeader h;
  std::memcpy(&h, p, sizeof(h));
  if (h.version == 0 || h.struct_size < min_size) {
    return VersionError(absl::StrCat(what, " has struct_size ", h.struct_size, " and version ", h.version,
                                     " (the smallest known layout has ", min_size,
                                     " bytes): initialise it with its STRATA_*_INIT macro"));
  }
  if (!input || h.struct_size <= known_size) return absl::OkStatus();
  const unsigned char* bytes = static_cast<const unsigned char*>(p);
  for (size_t i = known_size; i < h.struct_size; ++i) {
    if (bytes[i] != 0) {
      return VersionError(absl::StrCat(what, " sets a field at byte ", i, " that this library (ABI version ",
                                       STRATA_ABI_VERSION, ", a ", known_size,
                                       "-byte layout) does not know; use a newer libstrata"));
    }
  }
  return absl::OkStatus();
}

strata_dtype ToCDType(DType d) {
  switch (d) {
    case DType::kF32: return STRATA_DTYPE_F32;
    case DType::kBF16: return STRATA_DTYPE_BF16;
    case DType::kF16: return STRATA_DTYPE_F16;
  }
  return STRATA_DTYPE_F32;
}

absl::Status CheckComm(const strata_comm* c) {
  if (c == nullptr) return NullArgument("comm");
  if (c->magic != kCommMagic) return absl::InvalidArgumentError("comm is not a live strata_comm (destroyed?)");
  return absl::OkStatus();
}

absl::Status CheckEngine(const strata_engine* e) {
  if (e == nullptr) return NullArgument("engine");
  if (e->magic != kEngineMagic) return absl::InvalidArgumentError("engine is not a live strata_engine (destroyed?)");
  return absl::OkStatus();
}

absl::Status CheckRegisteredUnit(const strata_engine* e, int32_t unit) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  const int num_units = e->engine->num_units();
  if (unit < 0 || unit >= num_units) {
    return absl::OutOfRangeError(absl::StrCat("no unit ", unit, " (", num_units, " registered)"));
  }
  return absl::OkStatus();
}

absl::Status CheckRegistered(const strata_engine* e, int32_t unit, int32_t param) {
  STRATA_RETURN_IF_ERROR(CheckRegisteredUnit(e, unit));
  const shard::UnitLayout& l = e->engine->layout(unit);
  if (param < 0 || param >= static_cast<int>(l.params.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("unit '", l.name, "' has no parameter ", param, " (", l.params.size(), " registered)"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinalizedUnit(const strata_engine* e, int32_t unit) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (!e->finalized) {
    return absl::FailedPreconditionError(absl::StrCat("unit ", unit, " used before strata_engine_finalize"));
  }
  return CheckRegisteredUnit(e, unit);
}

absl::Status CheckFinalizedParam(const strata_engine* e, int32_t unit, int32_t param) {
  STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(e, unit));
  return CheckRegistered(e, unit, param);
}

}  // namespace strata::capi

extern "C" {

const char* strata_last_error(void) { return strata::capi::LastError(); }

uint32_t strata_abi_version(void) { return STRATA_ABI_VERSION; }

const char* strata_version_string(void) { return STRATA_VERSION_STRING; }

const char* strata_status_name(strata_status status) {
  switch (status) {
    case STRATA_OK: return "STRATA_OK";
    case STRATA_ERR_INVALID_ARGUMENT: return "STRATA_ERR_INVALID_ARGUMENT";
    case STRATA_ERR_FAILED_PRECONDITION: return "STRATA_ERR_FAILED_PRECONDITION";
    case STRATA_ERR_OUT_OF_RANGE: return "STRATA_ERR_OUT_OF_RANGE";
    case STRATA_ERR_RESOURCE_EXHAUSTED: return "STRATA_ERR_RESOURCE_EXHAUSTED";
    case STRATA_ERR_DEADLINE_EXCEEDED: return "STRATA_ERR_DEADLINE_EXCEEDED";
    case STRATA_ERR_UNIMPLEMENTED: return "STRATA_ERR_UNIMPLEMENTED";
    case STRATA_ERR_VERSION: return "STRATA_ERR_VERSION";
    case STRATA_ERR_NOT_FOUND: return "STRATA_ERR_NOT_FOUND";
    case STRATA_ERR_IO: return "STRATA_ERR_IO";
    case STRATA_ERR_INTERNAL: return "STRATA_ERR_INTERNAL";
    case STRATA_ERR_ALREADY_EXISTS: return "STRATA_ERR_ALREADY_EXISTS";
    case STRATA_ERR_PEER_FAILED: return "STRATA_ERR_PEER_FAILED";
    default: return "STRATA_ERR_UNKNOWN";
  }
}

}  // extern "C"
