#include "models/gpt/train/run_files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/comm/agree.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/json_input.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/step_dirs.h"

namespace strata::tools {

namespace fs = std::filesystem;

namespace {

absl::Status ErrnoAt(absl::string_view what, const std::string& path) {
  const int err = errno;
  return absl::Status(ErrnoError(what, err, __FILE__, __LINE__).code(),
                      absl::StrCat(what, " '", path, "': ", std::strerror(err), " (errno ", err, ")"));
}

std::string Names(const std::vector<std::string>& dirs) {
  std::vector<std::string> names;
  for (const std::string& d : dirs) names.push_back(fs::path(d).filename().string());
  if (names.size() > 4) {
    const size_t more = names.size() - 3;
    names.resize(3);
    names.push_back(absl::StrCat("and ", more, " more"));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace

std::string TrainerStateJson(const TrainOptions& o, const TrainerState& t) {
  nlohmann::ordered_json j;
  j["model_kind"] = "gpt2";
  j["model"] = {{"layers", o.model.layers}, {"d_model", o.model.d_model}, {"heads", o.model.heads},
                {"seq_len", o.model.seq_len}, {"vocab", o.model.vocab}};
  j["next_step"] = t.next_step;
  j["global_batch"] = t.global_batch.value_or(0);
  j["seed"] = o.engine.seed;
  j["data"] = o.data;
  j["data_order"] = o.order == gpt::DataOrder::kShuffled ? "shuffled" : "sequential";
  if (t.data_fingerprint.has_value()) j["data_fingerprint"] = absl::StrFormat("%016x", *t.data_fingerprint);
  j["run_id"] = t.run_id;
  if (t.owns_legacy) j["owns_legacy"] = true;
  return j.dump();
}

absl::StatusOr<TrainerState> ParseTrainerState(const std::string& state, const std::string& dir) {
  const std::string where = absl::StrCat("checkpoint '", dir, "' trainer state");
  auto j = checkpoint::ParseUntrustedJson(state, where);
  if (!j.ok() || !j->is_object() || !j->contains("next_step")) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir, "' lacks the trainer state (next_step)"));
  }
  const checkpoint::JsonReader in(where);
  TrainerState t;
  STRATA_ASSIGN_OR_RETURN(t.next_step, in.Int(*j, "next_step", "trainer.next_step", 0, INT64_MAX));
  if (j->contains("global_batch")) {
    STRATA_ASSIGN_OR_RETURN(t.global_batch, in.Int(*j, "global_batch", "trainer.global_batch", 1, INT64_MAX));
  }
  if (j->contains("seed")) {
    STRATA_ASSIGN_OR_RETURN(t.seed, in.Uint(*j, "seed", "trainer.seed"));
  }
  if (j->contains("run_id")) {
    STRATA_ASSIGN_OR_RETURN(t.run_id, in.Str(*j, "run_id", "trainer.run_id"));
    if (t.run_id.size() > 64 || !std::all_of(t.run_id.begin(), t.run_id.end(), absl::ascii_isxdigit)) {
      return in.Bad("trainer.run_id", "is not a run identity (at most 64 hex digits)");
    }
  }
  if (j->contains("owns_legacy")) {
    STRATA_ASSIGN_OR_RETURN(t.owns_legacy, in.Bool(*j, "owns_legacy", "trainer.owns_legacy"));
  }
  if (j->contains("data_order")) {
    STRATA_ASSIGN_OR_RETURN(std::string order, in.Str(*j, "data_order", "trainer.data_order"));
    t.data_order = order;
  }
  if (j->contains("data_fingerprint")) {
    STRATA_ASSIGN_OR_RETURN(std::string hex, in.Str(*j, "data_fingerprint", "trainer.data_fingerprint"));
    uint64_t v = 0;
    if (hex.size() != 16 || !absl::SimpleHexAtoi(hex, &v)) {
      return in.Bad("trainer.data_fingerprint", "is not 16 hex digits");
    }
    t.data_fingerprint = v;
  }
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::optional<int64_t> named = checkpoint::ParseStepDirName(p.filename().string());
  if (named.has_value() && *named != t.next_step) {
    return absl::DataLossError(absl::StrCat(where, ": field 'trainer.next_step' is ", t.next_step,
                                            " but the directory is named for step ", *named,
                                            " (a renamed or mixed-up checkpoint)"));
  }
  return t;
}

absl::StatusOr<TrainerState> ReadTrainerState(const std::string& path, std::string* step_dir) {
  STRATA_ASSIGN_OR_RETURN(*step_dir, checkpoint::ResolveCheckpoint(path));
  STRATA_ASSIGN_OR_RETURN(std::string text, checkpoint::ReadFileInDir(*step_dir, checkpoint::kManifestName,
                                                                      checkpoint::kMaxManifestBytes));
  STRATA_ASSIGN_OR_RETURN(checkpoint::Manifest man,
                          checkpoint::ParseManifest(text, (fs::path(*step_dir) / checkpoint::kManifestName).string()));
  return ParseTrainerState(man.trainer_json, *step_dir);
}

std::string NewRunId() {
  std::random_device dev;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::StrFormat("%08x", dev()));
  return id;
}

uint64_t TokensFingerprint(const std::vector<int32_t>& tokens) {
  uint64_t h = 0xcbf29ce484222325ull ^ tokens.size();  // FNV-1a over whole tokens: order-sensitive, portable
  for (int32_t t : tokens) h = (h ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
  return h;
}

std::string FileFingerprint(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // a Hugging Face checkpoint directory: its weight files
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      const std::string n = e.path().filename().string();
      if (absl::StartsWith(n, "model") && (absl::EndsWith(n, ".safetensors") || absl::EndsWith(n, ".index.json"))) {
        names.push_back(n);
      }
    }
    std::sort(names.begin(), names.end());
    std::vector<std::string> parts;
    for (const std::string& n : names) parts.push_back(absl::StrCat(n, ": ", FileFingerprint(path + "/" + n)));
    return absl::StrCat("directory {", absl::StrJoin(parts, "; "), "}");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::StrCat("unreadable: ", std::strerror(errno));
  struct stat st;
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<unsigned char> buf(1 << 20);
  if (::fstat(fd, &st) == 0) {
    for (off_t at : {off_t{0}, std::max<off_t>(0, st.st_size - static_cast<off_t>(buf.size()))}) {
      const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
      for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 0x100000001b3ull;
    }
  }
  ::close(fd);
  return absl::StrFormat("%d bytes, fingerprint %016x", static_cast<long long>(st.st_size), h);
}

// ---------------------------------------------------------------------------------------------------
// Note [Run outputs]. A run's outputs are checked before it trains, so a typo or a read-only directory
// costs seconds, not a finished run (issue 33 lost trained weights to an unwritable --save-weights):
//  - every output its own file (--metrics X --trace X --save-weights X overwrote one another);
//  - each output file's directory is created, and a temporary is created and removed there: the probe is
//    the same operation the real write does (temporary, then rename), so it fails for the same reasons
//    (read-only, permission, no space for an inode, a directory in the file's place), with the errno;
//  - the checkpoint directory is probed on every rank: each writes its own shard there;
//  - temporaries "<output>.tmp.<pid>" of writers that died (the pid is not running here) are removed.
// The outcome is then agreed across the ranks (Note [Agreed outcomes]): every rank stops alike.
// Weights and trace go to a temporary that is fsynced and renamed (a kill leaves the old file or none);
// metrics are appended one line per step with each write checked.
namespace {

// Temporaries in `dir` that `ours` claims whose writer is gone: no process runs here with the pid after
// their last ".tmp." ("<output>.tmp.<pid>", ".probe.<word>.rank<r>.tmp.<pid>").
void SweepStaleTemps(const std::string& dir, const std::function<bool(absl::string_view)>& ours) {
  auto removed = checkpoint::RemoveTemps(dir, [&](absl::string_view name) {
    const size_t at = name.rfind(".tmp.");
    int pid = 0;
    return ours(name) && at != absl::string_view::npos && absl::SimpleAtoi(name.substr(at + 5), &pid) && pid > 0 &&
           ::kill(pid, 0) != 0 && errno == ESRCH;
  });
  if (removed.ok() && !removed->empty()) {
    STRATA_LOG(Warning) << "removed " << removed->size() << " temporary file(s) that an earlier, killed run left in "
                        << dir << ": " << absl::StrJoin(*removed, ", ");
  }
}

// The probe CheckSharedDir leaves in a checkpoint directory for a moment: ".probe.<word>.rank<r>.tmp.<pid>".
std::string ProbeName(const std::string& word, int rank) {
  return absl::StrCat(".probe.", word, ".rank", rank, ".tmp.", ::getpid());
}

absl::Status ProbeWritable(const std::string& flag, const std::string& dir, const std::string& probe) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat(flag, ": cannot create directory '", dir, "': ", ec.message()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);  // this process's name: no one else's
  if (fd < 0) return Annotate(ErrnoAt("cannot create a file in its directory", probe), flag);
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status CheckOutputFile(const char* flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "' is a directory; name a file"));
  }
  STRATA_RETURN_IF_ERROR(Annotate(checkpoint::CheckReplaceable(path), flag));
  const fs::path parent = fs::path(path).parent_path();
  STRATA_RETURN_IF_ERROR(ProbeWritable(flag, parent.empty() ? "." : parent.string(), checkpoint::TempName(path)));
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0) {
    return Annotate(ErrnoAt("cannot write", path), flag);
  }
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  SweepStaleTemps(p.parent_path().empty() ? "." : p.parent_path().string(),
                  [&](absl::string_view name) { return absl::StartsWith(name, prefix); });
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOutputs(const TrainOptions& o, int rank) {
  if (!o.checkpoint_dir.empty()) {
    STRATA_RETURN_IF_ERROR(ProbeWritable("--checkpoint-dir", o.checkpoint_dir,
                                         (fs::path(o.checkpoint_dir) / ProbeName("start", rank)).string()));
    // Probes of a run killed during CheckSharedDir.
    SweepStaleTemps(o.checkpoint_dir, [](absl::string_view name) { return absl::StartsWith(name, ".probe."); });
  }
  if (rank != 0) return absl::OkStatus();
  const std::pair<const char*, const std::string*> outs[] = {
      {"--save-weights", &o.save_weights}, {"--metrics", &o.metrics}, {"--trace", &o.trace},
      {"--data", &o.data}, {"--init-from", &o.init_from}};  // the inputs last: an output must not name one
  constexpr size_t kOutputs = 3;
  for (size_t i = 0; i < kOutputs; ++i) {
    for (size_t j = i + 1; j < std::size(outs); ++j) {
      if (outs[i].second->empty() || outs[j].second->empty()) continue;
      if (j >= kOutputs && i == 0 && outs[j].first == std::string("--init-from"))
        continue;              // may be overwritten at the end
      std::error_code e1, e2;  // absolute first: weakly_canonical leaves a relative path that does not exist relative
      const auto a = fs::weakly_canonical(fs::absolute(*outs[i].second, e1), e1);
      const auto b = fs::weakly_canonical(fs::absolute(*outs[j].second, e2), e2);
      if (!e1 && !e2 && a == b) {
        return absl::InvalidArgumentError(absl::StrCat(outs[i].first, " and ", outs[j].first, " name the same file '",
                                                       *outs[i].second, "'; give each output its own"));
      }
    }
  }
  for (size_t i = 0; i < kOutputs; ++i) STRATA_RETURN_IF_ERROR(CheckOutputFile(outs[i].first, *outs[i].second));
  return absl::OkStatus();
}

absl::Status CheckSharedDir(const std::string& dir, comm::Communicator& comm, device::Stream& stream) {
  if (comm.size() == 1) return absl::OkStatus();
  // One name for this job's probes: rank 0's random word.
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> words,
                          comm::AllGatherText(comm, comm.rank() == 0 ? NewRunId() : "", stream));
  // Each rank's probe carries its own pid: gather the names rather than guess them.
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> names,
                          comm::AllGatherText(comm, ProbeName(words[0], comm.rank()), stream));
  const auto probe = [&](int r) { return (fs::path(dir) / names[r]).string(); };
  absl::Status mine;
  if (const int fd = ::open(probe(comm.rank()).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644); fd >= 0) {
    ::close(fd);
  } else {
    mine = Annotate(ErrnoAt("cannot create a file in its directory", probe(comm.rank())), "--checkpoint-dir");
  }
  STRATA_RETURN_IF_ERROR(comm::AgreeOnOutcome(mine, "checking --checkpoint-dir", comm, stream));
  absl::Status seen;
  if (comm.rank() == 0) {
    std::vector<int> missing;
    // A network file system's caches: up to two seconds, and at most a quarter of the peers' deadline.
    const int attempts = static_cast<int>(std::clamp<int64_t>(comm.options().timeout_ms / 400, 1, 20));
    for (int attempt = 0; attempt < attempts; ++attempt) {
      missing.clear();
      for (int r = 1; r < comm.size(); ++r) {
        std::error_code ec;
        if (!fs::exists(probe(r), ec)) missing.push_back(r);
      }
      if (missing.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!missing.empty()) {
      seen = absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint-dir '", dir, "': rank 0 does not see the files that ", comm::RanksText(missing),
          " created there: it must be one directory that every rank shares (a shared or parallel file system), not "
          "a disk local to each node, or no checkpoint could be loaded"));
    }
  }
  const absl::Status agreed = comm::AgreeOnOutcome(seen, "checking --checkpoint-dir", comm, stream);
  ::unlink(probe(comm.rank()).c_str());
  return agreed;
}

// ---------------------------------------------------------------------------------------------------
// Note [A directory per run]. Pruning and --resume work on step numbers, so a checkpoint directory holding
// two runs' steps mixed them up (issue 33: a new run with --keep-last 1 deleted an older run's newer
// steps, and --resume would have picked the other run's step). Each run has an identity, made at its start
// and kept by every resume of it, written in each of its checkpoints (trainer.run_id). The rule:
//  - a run starts only in a checkpoint directory that holds no complete step but its own, up to the step
//    it resumes from; another run's steps are refused (resume that run, or use another directory), and so
//    are this run's steps after the one resumed from (a rollback: the run would save over them, and pruning
//    would keep them as the newest), each naming the steps and the fix;
//  - pruning removes only this run's steps, and step directories without a manifest (a save that failed
//    or was killed: they never load, and nothing else removes them);
//  - --resume of a directory with steps of several runs is refused: name the step directory itself.
// Checkpoints written before runs had identities have none; they count as the run that resumes one of them.
namespace {

absl::StatusOr<std::string> StepRunId(const std::string& step_dir) {
  std::string resolved;
  STRATA_ASSIGN_OR_RETURN(TrainerState t, ReadTrainerState(step_dir, &resolved));
  return t.run_id;
}

}  // namespace

absl::Status CheckCheckpointDir(const std::string& dir, const std::string& run_id, int64_t first_step,
                                bool legacy_ok) {
  std::vector<std::string> others, later;
  for (const std::string& step_dir : checkpoint::CompleteSteps(dir)) {
    absl::StatusOr<std::string> read = StepRunId(step_dir);
    if (!read.ok()) {  // a damaged step is no run's: it never loads, and it must not block the directory
      STRATA_LOG(Warning) << "ignoring checkpoint " << step_dir
                          << ", which cannot be read: " << read.status().message();
      continue;
    }
    const std::string& id = *read;
    if (id != run_id && !(id.empty() && legacy_ok)) {
      others.push_back(step_dir);
    } else if (checkpoint::ParseStepDirName(fs::path(step_dir).filename().string()).value_or(0) > first_step) {
      later.push_back(step_dir);
    }
  }
  if (!others.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--checkpoint-dir '", dir, "' holds checkpoints of another run (", Names(others), "); a run never prunes or "
        "resumes another run's steps: pass --resume ", dir, " to continue that run, or give this run a directory "
        "of its own"));
  }
  if (!later.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--checkpoint-dir '", dir, "' holds checkpoints of this run after step ", first_step, ", the one resumed ("
        , Names(later), "): the run would save over them, and pruning would keep them as the newest; to roll back, "
        "move them out of the directory first, or give the resumed run another --checkpoint-dir"));
  }
  return absl::OkStatus();
}

absl::Status CheckOneRun(const std::string& root) {
  std::error_code ec;
  if (fs::exists(fs::path(root) / checkpoint::kManifestName, ec)) return absl::OkStatus();  // a step directory
  std::vector<std::string> ids, first_of;
  for (const std::string& step_dir : checkpoint::CompleteSteps(root)) {
    absl::StatusOr<std::string> id = StepRunId(step_dir);
    // Damaged steps and steps from before run identities (which any run resuming them owns) are no other run's.
    if (!id.ok() || id->empty()) continue;
    if (std::find(ids.begin(), ids.end(), *id) == ids.end()) {
      ids.push_back(*id);
      first_of.push_back(step_dir);
    }
  }
  if (ids.size() <= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--resume '", root, "' holds checkpoints of ", ids.size(), " different runs (their first steps: ",
      Names(first_of), "); name the step directory to resume, e.g. --resume ", checkpoint::CompleteSteps(root).back()));
}

void PruneCheckpoints(const std::string& dir, const std::string& run_id, bool legacy_ok, int64_t keep_last,
                      const std::string& just_saved) {
  std::vector<std::string> mine;
  for (const std::string& step_dir : checkpoint::CompleteSteps(dir)) {
    absl::StatusOr<std::string> id = StepRunId(step_dir);
    if (id.ok() && (*id == run_id || (id->empty() && legacy_ok))) mine.push_back(step_dir);
  }
  std::vector<std::string> remove;
  if (keep_last > 0 && static_cast<int64_t>(mine.size()) > keep_last) {
    remove.assign(mine.begin(), mine.end() - keep_last);
  }
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    const fs::path p = it->path();
    if (checkpoint::ParseStepDirName(p.filename().string()) && it->is_directory(e2) &&
        !fs::exists(fs::symlink_status(p / checkpoint::kManifestName, e2)) && p != fs::path(just_saved)) {
      STRATA_LOG(Warning) << "removing " << p.string() << ": a step directory without a manifest (a save that "
                          << "failed or was killed), which can never be loaded";
      remove.push_back(p.string());
    }
  }
  for (const std::string& step_dir : remove) {
    if (absl::Status s = checkpoint::RemoveStep(step_dir); !s.ok()) {
      STRATA_LOG(Warning) << "cannot remove old checkpoint " << step_dir << ": " << s.message();
    }
  }
}

// ---------------------------------------------------------------------------------------------------

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status MetricsFile::Open(const std::string& path, int64_t first_step) {
  path_ = path;
  if (first_step > 0) {
    std::ifstream in(path);
    if (in) {  // keep the lines of the steps up to the checkpoint; a line cut short is dropped
      std::string kept_text, line;
      int64_t kept = 0;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
        if (j["step"].get<int64_t>() > first_step) continue;
        absl::StrAppend(&kept_text, line, "\n");
        ++kept;
      }
      std::error_code ec;  // rewrite the file a symlink names, not the link: the link must keep pointing at it
      const fs::path target = fs::canonical(path, ec);
      STRATA_RETURN_IF_ERROR(
          Annotate(checkpoint::WriteFileAtomic(ec ? path : target.string(), kept_text), "--metrics"));
      std::printf("metrics: kept the %lld lines of steps up to %lld in %s; appending\n",
                  static_cast<long long>(kept), static_cast<long long>(first_step), path.c_str());
    }
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (first_step > 0 ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) return Annotate(ErrnoAt("cannot open", path), "--metrics");
  return absl::OkStatus();
}

absl::Status MetricsFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s = ::fsync(fd_) == 0 ? absl::OkStatus() : Annotate(ErrnoAt("writing", path_), "--metrics");
  if (::close(fd_) != 0 && s.ok()) s = Annotate(ErrnoAt("closing", path_), "--metrics");
  fd_ = -1;
  return s;
}

absl::Status MetricsFile::Append(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      absl::Status s = Annotate(ErrnoAt("writing", path_), "--metrics");
      // No half line stays behind: a reader of the file sees whole steps only.
      struct stat st;
      if (done > 0 && ::fstat(fd_, &st) == 0)
        static_cast<void>(::ftruncate(fd_, st.st_size - static_cast<off_t>(done)));
      return s;
    }
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace strata::tools
