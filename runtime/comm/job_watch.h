// Failure notices across torchrun nodes (issue 35; docs/decisions/0039-bootstrap-over-torchruns-store.md, "Failure
// notices across nodes"). torchrun's agent stops the ranks of its own node when one of them dies, but the ranks of
// the other nodes learn of it only at their next collective with the dead rank, or at a deadline. The job watch
// tells every rank of the job within a fraction of a second, over torchrun's store (tcp_store.h), and ends a rank
// that has not ended by itself a short while after the notice, as torchrun's agent ends the ranks of the node.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "runtime/comm/bootstrap.h"

namespace strata::comm {

// Note [Job watch]. Started once per process (later calls return OK at once; a call for another job is
// refused), before any wait of the job that a dead peer would stall:
//  - the death notice: a child process forked here holds a connection to the store and a pidfd of this process.
//    When this process ends with a signal or a non-zero status (EndedStatus: read from /proc while it is a
//    zombie, or from the pidfd once collected), or ends without running its C exit handlers when that status is
//    gone (a kernel older than 6.15), the child posts "rank R of N (...) died: ..."
//    under the job's failure key (the first notice of the job wins, counted with ADD), then exits. A clean exit
//    (status 0, or the exit handler's word when the status cannot be read) posts nothing. The child closes every
//    inherited descriptor but its three, so a dead rank's sockets (gloo's) still close at its death.
//  - the watcher: a thread that polls the failure key every kWatchPollMs. JobFailure() then returns the notice,
//    which the communicators' waits report at their next poll (foreign_communicator.cc, the bootstrap's
//    ExchangeBlob). A process still alive kEndAfterMs after the notice prints it and ends with status 1: a rank
//    blocked where Strata does not poll (torch's own rendezvous, the trainer's collectives) ends too.
// Keys: strata/job/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/failed and .../claim, so a restarted worker
// group never reads its predecessor's notice. A rank that exits 0 is no failure: its peers are told nothing.
absl::Status WatchTorchrunJob(const TorchrunEnv& env);

// WatchTorchrunJob, logging a warning when the watch cannot start (the job runs on without it).
void WatchTorchrunJobOrWarn(const TorchrunEnv& env);

// A rank's death, as the job watch posts it: the rank (torchrun's RANK) and the notice naming it.
struct JobDeath {
  int rank = -1;
  std::string notice;
};

// The job's failure notice once the watcher has seen it (a peer's death), else nullopt.
std::optional<JobDeath> JobFailure();

// The exit status of the ended process behind `pidfd` (`pid`), as waitpid reports it: read from /proc while it is a
// zombie, else (its parent, torchrun's agent, collected it first) from the pidfd (PIDFD_GET_INFO's PIDFD_INFO_EXIT,
// Linux 6.15 or later). -1 when neither can tell (an older kernel).
int EndedStatus(int pidfd, int pid);

// The failure notice a dead process gets, for `status` as waitpid reports it; -1 when the status is unknown
// (`clean_exit`: whether the process ran its C exit handlers). nullopt when it is no failure (exit 0).
std::optional<std::string> DeathNotice(const TorchrunEnv& env, int pid, const std::string& host, int status,
                                       bool clean_exit);

}  // namespace strata::comm
