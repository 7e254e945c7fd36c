// `strata doctor [--json] [--nvme-path DIR] [--nvme-test-size BYTES] [--ranks N] [--ranks-per-node R] [--measure ...]
// [train flags]`: checks this machine before training. Probes fill the facts (doctor_probe.h), pure functions give
// the verdicts (doctor_checks.h), doctor_report.h prints them. A model family's trainer flags (`strata train`'s
// for the GPT, the default; --model-family for another: --config, --stage, --model, ...) are accepted so the
// locked-memory and NVMe space checks see the same model and offload settings the job will use; a flag both
// declare (--nvme-path) means to the job what it means to `strata train`, so one command line serves both.
// Exit code: 0 unless a check fails (1); 2 for a usage error. MPI is never initialised: the doctor is one process,
// run on each node (or under the launcher) as wanted. Under torchrun every rank runs it and the launch check tries
// the id exchange with rank 0 for real.
// --measure (seconds) also measures the host's rates for `strata plan --host-figures` (doctor_measure.h):
// the collectives through children the found launcher starts, so the doctor itself still has no MPI.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/base/env.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/comm/bootstrap.h"
#include "spec/registry.h"
#include "tools/cli/commands.h"
#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/doctor_measure.h"
#include "tools/doctor/doctor_probe.h"
#include "tools/doctor/doctor_report.h"

namespace strata::tools {
namespace {

constexpr uint64_t kDefaultNvmeTestBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxNvmeTestBytes = uint64_t{1} << 30;
constexpr double kNvmeSecondsPerDirection = 5;

std::vector<spec::FlagDef> DoctorFlagDefs() {
  return {{"json", true, "print one JSON object (checks and the raw facts) instead of the table"},
          {"nvme-path", false,
           "directory to bandwidth-test (default: the config's offload nvme_path); also the job's NVMe "
           "directory, as strata train's --nvme-path"},
          {"nvme-test-size", false,
           "bytes written then read back (default 256MiB, at most 1GiB and a quarter of the free space)"},
          {"ranks", false,
           "ranks the pinned-memory and NVMe estimates shard over (default: launcher size, GPUs, or 1); "
           "--measure: the ranks that share this node"},
          {"ranks-per-node", false,
           "ranks of this node whose NVMe stores share its disks (default: the launcher's local size, else --ranks)"},
          {"measure", true,
           "measure the host's sgemm, AdamW and MPI collective rates (takes seconds; for strata plan --host-figures)"},
          {"launcher", false, "--measure: the MPI launcher for the collectives (default: the one found on PATH)"},
          {"comm-bytes", false, "--measure: the collectives' buffer (default 4MiB)"},
          {"adam-elems", false, "--measure: elements of the AdamW stream test (default 16777216)"},
          {"measure-timeout", false,
           "--measure: seconds each child (bench adam, each collectives launch) may take "
           "before its process group is killed (default 120)"},
          {"help", true, "this text"}};
}

struct DoctorOptions {
  bool json = false;
  std::string nvme_path;
  uint64_t nvme_test_bytes = kDefaultNvmeTestBytes;
  int64_t ranks = 0;  // 0 = pick a default after probing
  int64_t ranks_per_node = 0;  // 0 = the launcher's local size, else the ranks
  bool measure = false;
  std::string launcher;
  uint64_t comm_bytes = uint64_t{4} << 20;
  uint64_t adam_elems = uint64_t{1} << 24;
  int64_t measure_timeout_s = 120;
  std::shared_ptr<const spec::TrainSetup> train;  // the family's setup of the rest of the flags
};

// The arguments for the family's ParseTrain: all but the doctor's own. A flag the family declares too
// (--nvme-path) goes to both: the job must read it as `strata train` would, or the doctor checks another job
// (an NVMe offload without its path fails to parse).
std::vector<std::string> TrainArgs(const std::vector<std::string>& args, const std::vector<spec::FlagDef>& mine,
                                   const std::vector<spec::FlagDef>& train) {
  auto named = [](const std::string& arg, const spec::FlagDef& d) {
    const std::string flag = "--" + d.name;
    return arg == flag || arg.rfind(flag + "=", 0) == 0;
  };
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const spec::FlagDef* own = nullptr;
    for (const spec::FlagDef& d : mine) {
      if (named(args[i], d)) own = &d;
    }
    const bool shared =
        std::any_of(train.begin(), train.end(), [&](const spec::FlagDef& d) { return named(args[i], d); });
    if (own == nullptr || shared) {
      rest.push_back(args[i]);
    } else if (!own->boolean && args[i].find('=') == std::string::npos) {
      ++i;  // skip its value
    }
  }
  return rest;
}

absl::StatusOr<DoctorOptions> ParseDoctorOptions(std::vector<std::string> args) {
  STRATA_ASSIGN_OR_RETURN(const spec::Family* family, spec::TakeFamily(&args));  // --model-family
  std::vector<spec::FlagDef> all = DoctorFlagDefs();
  const std::vector<spec::FlagDef> train = family->TrainFlagDefs();
  all.insert(all.end(), train.begin(), train.end());
  STRATA_ASSIGN_OR_RETURN(spec::Flags f, spec::Flags::Parse(args, all));  // unknown flags: nearest of either set
  DoctorOptions o;
  o.json = f.Bool("json");
  o.nvme_path = f.Str("nvme-path");
  if (f.Has("nvme-test-size")) {
    STRATA_ASSIGN_OR_RETURN(o.nvme_test_bytes, ParseBytes(f.Str("nvme-test-size")));
    if (o.nvme_test_bytes < (uint64_t{16} << 20) || o.nvme_test_bytes > kMaxNvmeTestBytes) {
      return absl::InvalidArgumentError("--nvme-test-size must be in [16MiB, 1GiB]");
    }
  }
  STRATA_ASSIGN_OR_RETURN(o.ranks, f.IntIn("ranks", 0, 1, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(o.ranks_per_node, f.IntIn("ranks-per-node", 0, 1, 1 << 20));
  if (o.ranks > 0 && o.ranks_per_node > o.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks-per-node ", o.ranks_per_node, " is more than --ranks ", o.ranks));
  }
  o.measure = f.Bool("measure");
  o.launcher = f.Str("launcher");
  for (const char* flag : {"launcher", "comm-bytes", "adam-elems", "measure-timeout"}) {
    if (f.Has(flag) && !o.measure) return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs --measure"));
  }
  if (f.Has("comm-bytes")) {
    STRATA_ASSIGN_OR_RETURN(o.comm_bytes, ParseBytes(f.Str("comm-bytes")));
    if (o.comm_bytes < (uint64_t{64} << 10) || o.comm_bytes > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError("--comm-bytes must be in [64KiB, 1GiB]");
    }
  }
  STRATA_ASSIGN_OR_RETURN(const int64_t elems, f.IntIn("adam-elems", int64_t(o.adam_elems), 1024, int64_t{1} << 30));
  o.adam_elems = uint64_t(elems);
  STRATA_ASSIGN_OR_RETURN(o.measure_timeout_s, f.IntIn("measure-timeout", o.measure_timeout_s, 1, 86400));
  STRATA_ASSIGN_OR_RETURN(o.train,
                          family->ParseTrain(TrainArgs(args, DoctorFlagDefs(), train), o.ranks > 0 ? int(o.ranks) : 1));
  return o;
}

// The NVMe path to test: the flag, else the config's offload path, else none (and why).
void ProbeNvmeFor(const DoctorOptions& o, doctor::DoctorFacts* f) {
  std::string path = o.nvme_path;
  if (path.empty()) path = o.train->engine.offload_optimizer.nvme_path;
  if (path.empty()) path = o.train->engine.offload_param.nvme_path;
  if (path.empty()) {
    f->nvme.skipped_reason = "no --nvme-path given and the config offloads nothing to NVMe";
    return;
  }
  f->nvme = doctor::ProbeNvme(path, o.nvme_test_bytes, kNvmeSecondsPerDirection);
}

// Under torchrun (Note [Launchers] in runtime/comm/launcher.cc), the variables and rank 0's id exchange over
// torchrun's store, for real: rank 0 sends its host name, within the collective timeout.
void ProbeLaunch(const DoctorOptions& o, doctor::LaunchFacts* l) {
  auto t = comm::TorchrunLaunch();
  if (absl::IsNotFound(t.status())) return;
  l->torchrun = true;
  if (!t.ok()) {
    l->error = std::string(t.status().message());
    return;
  }
  l->rank = t->rank;
  l->size = t->world_size;
  l->exchange = absl::StrCat(t->master_addr, ":", t->master_port);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const auto start = std::chrono::steady_clock::now();
  auto got =
      comm::ExchangeBlob(*t, "doctor", t->rank == 0 ? std::string(host) : "", o.train->engine.collective_timeout_ms);
  l->exchange_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (got.ok()) {
    l->rank0_host = *got;
  } else {
    l->error = std::string(got.status().message());
  }
}

doctor::DoctorFacts Probe(const DoctorOptions& o) {
  doctor::DoctorFacts f;
  doctor::ProbeGpus(&f);
  doctor::ProbeLibraries(&f.versions);
  doctor::ProbeHost(&f);
  int ranks = static_cast<int>(o.ranks);
  if (ranks == 0) ranks = f.mpi.launcher_world_size > 0 ? f.mpi.launcher_world_size : std::max<int>(1, f.gpus.size());
  const spec::ModelSpec& model = *o.train->model;
  f.pinned = doctor::EstimatePinned(o.train->engine, model, ranks);
  // The ranks of this node: all of them share its disks (one NVMe per node is the common case).
  int on_node = static_cast<int>(o.ranks_per_node);
  if (on_node == 0) on_node = f.mpi.launcher_local_size > 0 ? f.mpi.launcher_local_size : ranks;
  auto space = doctor::EstimateNvmeSpace(o.train->engine, o.train->model, ranks, on_node);
  if (space.ok()) {
    f.nvme_space = *std::move(space);
    doctor::ProbeNvmeSpace(&f.nvme_space);
  } else {
    f.nvme_space.offloaded = true;
    f.nvme_space.error = std::string(space.status().message());
  }
  // After the free space was read: the bandwidth test's file is freed when it is deleted, but a file system may
  // give the room back later (XFS did, seconds after), and the space check read 48 MiB short of the job's room.
  ProbeNvmeFor(o, &f);
  ProbeLaunch(o, &f.launch);
  if (o.measure) {
    doctor::MeasureOptions m;
    m.ranks = ranks;
    const spec::Product product = model.HostProduct(o.train->engine.train_micro_batch_size_per_gpu);
    m.sgemm_m = product.m;
    m.sgemm_k = product.k;
    m.sgemm_n = product.n;
    m.sgemm = [&model](int mm, int k, int n, double seconds) { return model.HostProductGflops({mm, k, n}, seconds); };
    m.adam_elems = o.adam_elems;
    m.comm_bytes = o.comm_bytes;
    m.launcher = o.launcher.empty() ? f.mpi.launcher_path : o.launcher;
    m.under_launcher = f.mpi.launcher_world_size > 0;
    m.child_timeout = std::chrono::seconds(o.measure_timeout_s);
    f.host = doctor::MeasureHost(m);
  }
  return f;
}

}  // namespace

std::string DoctorUsage() {
  return spec::Flags::Usage("doctor", DoctorFlagDefs()) + spec::FamilyFlagUsage() +
         "  (also accepts the family's model and config flags, strata train's: --config, --stage, --model, ...)\n" +
         spec::OtherFamiliesUsage();
}

int DoctorCommand(const std::vector<std::string>& args) {
  auto opts = ParseDoctorOptions(args);
  if (!opts.ok()) {
    std::fprintf(stderr, "strata doctor: %s\n", std::string(opts.status().message()).c_str());
    return 2;
  }
  const doctor::DoctorFacts facts = Probe(*opts);
  const std::vector<doctor::CheckResult> checks = doctor::RunChecks(facts);
  const std::string out = opts->json ? doctor::RenderJson(facts, checks) : doctor::RenderTable(checks);
  std::fputs(out.c_str(), stdout);
  return doctor::Worst(checks) == doctor::Verdict::kFail ? 1 : 0;
}

}  // namespace strata::tools
