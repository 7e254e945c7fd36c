// Bootstrap without MPI: torchrun-style environment variables, and an exchange that hands one blob from rank 0
// to every rank (the ncclUniqueId of the NCCL back-end) over torchrun's own key-value store on
// MASTER_ADDR:MASTER_PORT (tcp_store.h). Strata listens on no port of its own, so its bootstrap cannot collide
// with another job's (docs/decisions/0039-bootstrap-over-torchruns-store.md). Only the id travels over the store;
// the data path is NCCL's (docs/design.md "Communication": nothing home-made on the data path).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/base/env.h"

namespace strata::comm {

struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;  // torchrun's store (the agent's, or rank 0's torch.distributed store)
  // The job's namespace in the store: TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT ("none", "0" when unset),
  // so that a restarted worker group never reads its predecessor's keys.
  std::string run_id = "none";
  std::string restart_count = "0";
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves the store for the whole job. Otherwise only a
  // torch.distributed rank 0 in the job serves it (init_process_group), and `strata train` has no store to use.
  bool agent_store = false;
  int local_world_size = 0;  // LOCAL_WORLD_SIZE: the ranks on this node; 0 when unset
};

// Validates the variables: all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT present (LOCAL_RANK defaults to
// RANK), integers in range; errors name the variable and its value. STRATA_BOOTSTRAP_PORT, the retired exchange
// port, is refused naming why. NotFound when none of the torchrun variables is set (not a torchrun launch).
absl::StatusOr<TorchrunEnv> ParseTorchrunEnv(const env::TorchrunVars& vars);

// The torchrun launch this process belongs to, read from the environment: NotFound unless WORLD_SIZE is
// set and no MPI launcher started the process (env::MpiLauncherWorldSize; Note [Launchers] in
// runtime/comm/launcher.cc), else ParseTorchrunEnv's result.
absl::StatusOr<TorchrunEnv> TorchrunLaunch();

// Note [Bootstrap over the store]. Rank 0 passes the blob; every rank receives it, once every rank has arrived.
// `name` tells this exchange from the process's others (every rank passes the same). `local` is this rank's own
// verdict on joining (a GPU missing, say): a rank that is not OK, a rank claimed twice or a rank with another
// WORLD_SIZE fails every rank at once, each naming that rank and its cause. Blocks up to `timeout_ms`; at the
// deadline every rank names the ranks that had not arrived.
absl::StatusOr<std::string> ExchangeBlob(const TorchrunEnv& env, const std::string& name, const std::string& blob,
                                         int64_t timeout_ms, const absl::Status& local = absl::OkStatus());

}  // namespace strata::comm
