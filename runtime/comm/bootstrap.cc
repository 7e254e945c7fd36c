#include "runtime/comm/bootstrap.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/comm/job_watch.h"
#include "runtime/comm/tcp_store.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<int> IntVar(const char* name, const std::optional<std::string>& v, int lo, int hi) {
  int out = 0;
  if (!v) return absl::InvalidArgumentError(absl::StrCat("torchrun-style launch: ", name, " is not set"));
  if (!absl::SimpleAtoi(*v, &out) || out < lo || out > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("torchrun-style launch: ", name, "='", *v, "' is not an integer in [", lo, ", ", hi, "]"));
  }
  return out;
}

// Note [Bootstrap over the store]. Every key of one exchange lies under
// strata/bootstrap/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/<name>/:
//   claim/<r>    ADD 1 by the process that says it is rank r: a second claim (RANK twice) is an error.
//   arrived/<r>  rank r's WORLD_SIZE, a newline, and its own verdict on joining ("" when it can join).
//   id           rank 0's blob.
//   failed       the first failure seen: every rank polls it, so one rank's failure ends every rank at once.
//   done         set by rank 0 once every rank has arrived and agrees: the others then read the id.
// Each rank polls every 20 ms, so a failure reaches the others within a poll; a rank that never arrives is
// named by every rank at the deadline. Nothing listens but torchrun's store: no port of Strata's own.
class Exchange {
 public:
  Exchange(const TorchrunEnv& env, const std::string& name, TcpStoreClient store, Clock::time_point deadline)
      : env_(env),
        prefix_(absl::StrCat("strata/bootstrap/", env.run_id, "/", env.restart_count, "/", name, "/")),
        store_(std::move(store)),
        deadline_(deadline) {}

  absl::StatusOr<std::string> Run(const std::string& blob, const absl::Status& local) {
    STRATA_ASSIGN_OR_RETURN(const int64_t claims, store_.Add(Key("claim/", env_.rank), 1, Io()));
    std::string verdict = local.ok() ? "" : local.ToString();
    if (claims > 1) {
      verdict = absl::StrCat("RANK=", env_.rank, " was started twice (two processes claim it)");
    }
    STRATA_RETURN_IF_ERROR(
        store_.Set(Key("arrived/", env_.rank), absl::StrCat(env_.world_size, "\n", verdict), Io()));
    if (!verdict.empty()) return Fail(absl::StrCat("rank ", env_.rank, " of ", env_.world_size, ": ", verdict));
    if (env_.rank == 0) STRATA_RETURN_IF_ERROR(store_.Set(prefix_ + "id", blob, Io()));
    std::vector<bool> arrived(env_.world_size, false);
    arrived[env_.rank] = true;
    while (true) {
      const Clock::time_point io = Io();
      STRATA_ASSIGN_OR_RETURN(const bool failed, store_.Check(prefix_ + "failed", io));
      if (failed) {
        STRATA_ASSIGN_OR_RETURN(const std::string why, store_.Get(prefix_ + "failed", io));
        return Error(why);
      }
      if (std::optional<JobDeath> died = JobFailure()) return Error(died->notice);  // Note [Job watch]
      if (env_.rank == 0) {
        STRATA_ASSIGN_OR_RETURN(const bool all, CheckArrivals(arrived, io));
        if (all) {
          STRATA_RETURN_IF_ERROR(store_.Set(prefix_ + "done", "", io));
          return blob;
        }
      } else {
        STRATA_ASSIGN_OR_RETURN(const bool done, store_.Check(prefix_ + "done", io));
        if (done) return store_.Get(prefix_ + "id", io);
      }
      if (Clock::now() + std::chrono::milliseconds(20) >= deadline_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Missing();
  }

  // A failure of this rank: posted for every rank, and returned.
  absl::Status Fail(const std::string& why) {
    const absl::Status posted = store_.Set(prefix_ + "failed", why, Io());
    absl::Status s = Error(why);
    if (!posted.ok()) s = Annotate(s, absl::StrCat("(could not tell the other ranks: ", posted.message(), ")"));
    return s;
  }

 private:
  std::string Key(const char* what, int rank) const { return absl::StrCat(prefix_, what, rank); }

  // The deadline of one store request: the exchange's, or 2 s from now if that is later. A request begun
  // just before the exchange's deadline (a loaded host answers late) then completes, and the exchange ends
  // at Missing(), naming the ranks that had not arrived, instead of in a store timeout of its own; only a
  // store that does not answer at all is reported as one.
  Clock::time_point Io() const { return std::max(deadline_, Clock::now() + std::chrono::seconds(2)); }

  absl::Status Error(const std::string& why) const {
    return absl::FailedPreconditionError(absl::StrCat("bootstrap over torchrun's store at ", store_.where(), " (rank ",
                                                      env_.rank, " of ", env_.world_size, "): ", why));
  }

  // Rank 0: reads the ranks not yet seen; true once all have arrived. A rank with a verdict or with another
  // WORLD_SIZE is failed here, for every rank.
  absl::StatusOr<bool> CheckArrivals(std::vector<bool>& arrived, Clock::time_point io) {
    for (int r = 0; r < env_.world_size; ++r) {
      if (arrived[r]) continue;
      STRATA_ASSIGN_OR_RETURN(const bool here, store_.Check(Key("arrived/", r), io));
      if (!here) return false;
      STRATA_ASSIGN_OR_RETURN(const std::string a, store_.Get(Key("arrived/", r), io));
      const std::string size = a.substr(0, a.find('\n'));
      if (size != std::to_string(env_.world_size)) {
        return Fail(absl::StrCat("rank ", r, " has WORLD_SIZE=", size, " and rank 0 WORLD_SIZE=", env_.world_size,
                                 ": every rank of a job needs torchrun's own WORLD_SIZE"));
      }
      const std::string verdict = a.substr(std::min(a.size(), size.size() + 1));
      if (!verdict.empty()) {  // its own notice may not be posted yet: the same words, from here
        return Fail(absl::StrCat("rank ", r, " of ", env_.world_size, ": ", verdict));
      }
      arrived[r] = true;
    }
    return true;
  }

  absl::Status Missing() {
    std::vector<int> missing;
    for (int r = 0; r < env_.world_size; ++r) {
      auto here = store_.Check(Key("arrived/", r), Clock::now() + std::chrono::seconds(2));
      if (here.ok() && !*here) missing.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "bootstrap over torchrun's store at ", store_.where(), " (rank ", env_.rank, " of ", env_.world_size, "): ",
        missing.empty() ? std::string("rank 0 had not completed the exchange")
                        : absl::StrCat("rank(s) ", absl::StrJoin(missing, ","), " had not arrived"),
        " by the deadline"));
  }

  const TorchrunEnv& env_;
  const std::string prefix_;
  TcpStoreClient store_;
  const Clock::time_point deadline_;
};

}  // namespace

absl::StatusOr<TorchrunEnv> ParseTorchrunEnv(const env::TorchrunVars& v) {
  if (!v.rank && !v.world_size && !v.master_addr && !v.master_port) {
    return absl::NotFoundError("not a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset)");
  }
  TorchrunEnv e;
  STRATA_ASSIGN_OR_RETURN(e.world_size, IntVar("WORLD_SIZE", v.world_size, 1, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(e.rank, IntVar("RANK", v.rank, 0, e.world_size - 1));
  STRATA_ASSIGN_OR_RETURN(e.local_rank, IntVar("LOCAL_RANK", v.local_rank ? v.local_rank : v.rank, 0, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(e.master_port, IntVar("MASTER_PORT", v.master_port, 1, 65535));
  if (!v.master_addr || v.master_addr->empty()) {
    return absl::InvalidArgumentError("torchrun-style launch: MASTER_ADDR is not set");
  }
  e.master_addr = *v.master_addr;
  if (v.bootstrap_port) {
    return absl::InvalidArgumentError(
        "STRATA_BOOTSTRAP_PORT is set, but Strata's bootstrap no longer listens on a port of its own: it uses "
        "torchrun's store on MASTER_ADDR:MASTER_PORT (docs/decisions/0039); unset STRATA_BOOTSTRAP_PORT");
  }
  if (v.local_world_size) {
    STRATA_ASSIGN_OR_RETURN(e.local_world_size,
                            IntVar("LOCAL_WORLD_SIZE", v.local_world_size, e.local_rank + 1, e.world_size));
  }
  if (v.run_id && !v.run_id->empty()) e.run_id = *v.run_id;
  if (v.restart_count && !v.restart_count->empty()) e.restart_count = *v.restart_count;
  e.agent_store = v.use_agent_store.value_or("") == "True";
  return e;
}

absl::StatusOr<TorchrunEnv> TorchrunLaunch() {
  const env::TorchrunVars vars = env::Torchrun();
  if (env::MpiLauncherWorldSize() || !vars.world_size) {
    return absl::NotFoundError("not a torchrun launch (WORLD_SIZE unset, or started by an MPI launcher)");
  }
  return ParseTorchrunEnv(vars);
}

absl::StatusOr<std::string> ExchangeBlob(const TorchrunEnv& env, const std::string& name, const std::string& blob,
                                         int64_t timeout_ms, const absl::Status& local) {
  if (env.world_size == 1) {
    STRATA_RETURN_IF_ERROR(local);
    return blob;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  // torchrun's agent serves its store before it starts a worker, and a torch.distributed rank 0 before its
  // init_process_group returns: a store still missing after 30 s is not coming.
  const auto connect_by = std::min(deadline, Clock::now() + std::chrono::seconds(30));
  absl::StatusOr<TcpStoreClient> store = TcpStoreClient::Connect(env.master_addr, env.master_port, connect_by);
  if (!store.ok()) {
    return Annotate(store.status(),
                    absl::StrCat("bootstrap of rank ", env.rank, " of ", env.world_size,
                                 " over torchrun's store (MASTER_ADDR:MASTER_PORT)",
                                 env.agent_store ? ""
                                                 : "; TORCHELASTIC_USE_AGENT_STORE is not True, so only a "
                                                   "torch.distributed rank 0 of the job serves that store: launch "
                                                   "with torchrun's c10d or static rendezvous"));
  }
  Exchange exchange(env, name, *std::move(store), deadline);
  return exchange.Run(blob, local);
}

}  // namespace strata::comm
