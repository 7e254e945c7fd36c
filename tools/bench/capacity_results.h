// The capacity search's results as they finish, kept through an interruption.
//
// Note [Interrupted search]. A candidate near the limit can train for minutes, so SIGINT / SIGTERM do not
// wait for it: the handler ends the process at once (_exit), after a one-line message naming how many
// candidates finished and where they are. That is safe because every candidate's line is written by one
// write(2) to an O_APPEND file, and the handler never ends the process inside that write: the writer
// announces it (`busy`), and a signal that arrives meanwhile only leaves a note (`pending`) that the
// writer acts on when its line is complete. So the file holds whole lines only, one per finished
// candidate. Nothing else needs cleaning up: the engine's NVMe swap files are unlinked as soon as they
// are created (runtime/offload/nvme_files.h, Note [Swap files leave nothing behind]).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace strata::tools {

class CapacityResults {
 public:
  // Opens `path` for appending ("" keeps nothing; the handler still reports and exits) and installs the
  // SIGINT / SIGTERM handler of Note [Interrupted search]. One instance per process.
  absl::Status Open(const std::string& path);
  // Appends `line` as one JSON line (no-op without a file). Counts the candidate as finished either way.
  absl::Status Append(const nlohmann::json& line);
  int finished() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace strata::tools
