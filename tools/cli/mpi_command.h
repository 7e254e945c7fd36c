// MPI start-up shared by the CLI commands that run one process per rank (train, bench step, bench
// capacity): MPI is initialised once, with MPI_THREAD_MULTIPLE, and a failure is printed with the
// command's name. The runtime finalises MPI when it goes out of scope.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "runtime/comm/mpi_communicator.h"

namespace strata::tools {

// nullptr after printing the reason ("strata train: ...") when MPI cannot be initialised.
inline std::unique_ptr<comm::MpiRuntime> StartMpi(const char* command) {
  int argc = 1;
  char arg0[] = "strata";
  char* argv0[] = {arg0, nullptr};
  char** argv = argv0;
  auto mpi = comm::MpiRuntime::Init(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command, std::string(mpi.status().message()).c_str());
    return nullptr;
  }
  return std::move(*mpi);
}

}  // namespace strata::tools
