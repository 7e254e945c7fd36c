// The files a `strata train` run owns besides the engine's shards: the trainer state in each checkpoint
// (with the run's identity), the checkpoint directory's step directories, and the metrics, trace and
// weights outputs. Note [Run outputs] in run_files.cc says what is checked before training and how each
// file is written so that no failure is silent and nothing is left behind.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/train/train_options.h"
#include "runtime/comm/communicator.h"

namespace strata::tools {

// The trainer's part of a checkpoint (the manifest's "trainer" object).
struct TrainerState {
  int64_t next_step = 0;
  std::optional<int64_t> global_batch;
  std::optional<uint64_t> seed;
  std::string run_id;                        // "" in checkpoints written before runs had identities
  bool owns_legacy = false;                  // the run resumed such a checkpoint: steps without an id are its own
  std::optional<std::string> data_order;     // "shuffled" / "sequential"
  std::optional<uint64_t> data_fingerprint;  // TokensFingerprint of the data it trained on
};
std::string TrainerStateJson(const TrainOptions& o, const TrainerState& t);
// Every field type-checked (the checkpoint may come from anywhere); next_step must be the step that `dir`
// is named for.
absl::StatusOr<TrainerState> ParseTrainerState(const std::string& state, const std::string& dir);
// The trainer state of the checkpoint that `path` resolves to (checkpoint::ResolveCheckpoint), read from its
// manifest without loading any shard; `*step_dir` gets that directory.
absl::StatusOr<TrainerState> ReadTrainerState(const std::string& path, std::string* step_dir);

// A new run's identity: 128 random bits in hex.
std::string NewRunId();
// A 64-bit fingerprint of the token stream, the same on every machine.
uint64_t TokensFingerprint(const std::vector<int32_t>& tokens);
// A file's size and a fingerprint of its first and last MiB, as text ("unreadable: <why>" when it cannot be read):
// to compare a file that every rank reads from its own path. For a directory (a Hugging Face checkpoint), the same
// of each of its model*.safetensors and model*.index.json files, by name.
std::string FileFingerprint(const std::string& path);

// Note [Run outputs]: what this rank writes, checked before training (every rank its checkpoint directory,
// rank 0 its output files): each writable and distinct, with stale temporaries of dead writers swept.
absl::Status CheckOutputs(const TrainOptions& o, int rank);
// Note [Visible shards], before training: every rank leaves a probe file in `dir`, and rank 0 must see them
// all; a directory local to each node fails here, on every rank, instead of at the first save. Collective.
absl::Status CheckSharedDir(const std::string& dir, comm::Communicator& comm, device::Stream& stream);
// Note [A directory per run] (rank 0): `dir` may hold only steps of run `run_id` (or, when `legacy_ok`,
// steps without an identity) up to `first_step`; anything else is refused, naming the steps and the fix.
absl::Status CheckCheckpointDir(const std::string& dir, const std::string& run_id, int64_t first_step, bool legacy_ok);
// `--resume ROOT` picks the newest complete step: refused when ROOT holds steps of more than one run.
absl::Status CheckOneRun(const std::string& root);
// After a save (rank 0): removes this run's complete steps but the newest `keep_last` (0: keeps all), and every
// step directory without a manifest (a save that failed or was killed) but `just_saved`.
void PruneCheckpoints(const std::string& dir, const std::string& run_id, bool legacy_ok, int64_t keep_last,
                      const std::string& just_saved);

// The metrics file: one JSON line per step, each write checked, its errno named.
class MetricsFile {
 public:
  MetricsFile() = default;
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  // Resuming at `first_step` > 0 keeps the lines of steps up to it (those after, from a run that went on past
  // the checkpoint, are dropped: this run writes them again) and appends; otherwise the file starts anew.
  absl::Status Open(const std::string& path, int64_t first_step);
  absl::Status Append(const std::string& line);  // `line` ends in '\n'
  absl::Status Close();  // fsync and close: an error the kernel kept until now is named here
  bool is_open() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace strata::tools
