// Running a child process and capturing its standard output (for commands that drive other commands,
// such as `strata bench scaling` launching `mpirun ... strata bench step`).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tools {

// Runs argv[0] (searched on PATH) with argv, stdin and stderr inherited, and returns everything it wrote
// to stdout. A spawn failure names the program and errno; a non-zero exit or a signal is an error naming
// the command line, the exit status and the last lines of its output.
//
// Without a timeout it blocks until the child exits (and anything that kept its stdout closes it), in
// this process's own process group, as a shell runs a command.
//
// With a timeout the child starts in a process group of its own (so that a launcher's children, mpirun's
// ranks, can be killed with it), its stdin is /dev/null (a background group reading the terminal would be
// stopped until the deadline), and while it runs SIGINT, SIGTERM and SIGHUP sent to this process are
// forwarded to that group and then re-raised here once it is reaped (Ctrl-C still stops both). When the
// child has not exited and closed its stdout by then, the whole group gets SIGTERM, then SIGKILL after a
// grace of up to 2 s, the child is reaped, and the result is DeadlineExceeded naming the command line,
// the timeout and the output so far.
absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv,
                                          std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// The absolute path of the running executable (/proc/self/exe).
absl::StatusOr<std::string> SelfExecutable();

}  // namespace strata::tools
