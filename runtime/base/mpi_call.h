// Call-site wrapper for MPI: the status keeps the call text, file:line and MPI's own error string.
// Header-only so that runtime/base does not link MPI; include it only where mpi.h is available.
#pragma once

#include "absl/strings/string_view.h"
#include <mpi.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata {

inline absl::Status MpiError(const char* call, int code, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                          absl::string_view(text, static_cast<size_t>(len)), " (MPI error ", code,
                                          ")"));
}

}  // namespace strata

#define STRATA_MPI_CALL(call)                                                       \
  ([&]() -> ::absl::Status {                                                        \
    const int strata_mpi_rc_ = (call);                                              \
    if (strata_mpi_rc_ != MPI_SUCCESS) return ::strata::MpiError(#call, strata_mpi_rc_, __FILE__, __LINE__); \
    return ::absl::OkStatus();                                                      \
  }())
