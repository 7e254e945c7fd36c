// Running a child process and capturing its standard output (for commands that drive other commands,
// such as `strata bench scaling` launching `mpirun ... strata bench step`).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tools {

// Runs argv[0] (searched on PATH) with argv, stdin and stderr inherited, and returns everything it wrote
// to stdout. Blocks until the child exits. A spawn failure names the program and errno; a non-zero exit
// or a signal is an error naming the command line, the exit status and the last lines of its output.
absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv);

// The absolute path of the running executable (/proc/self/exe).
absl::StatusOr<std::string> SelfExecutable();

}  // namespace strata::tools
