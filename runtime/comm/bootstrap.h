// Bootstrap without MPI: torchrun-style environment variables, and a small TCP exchange that hands one
// blob from rank 0 to every rank (the ncclUniqueId of the NCCL back-end). Only the id travels over this
// socket; the data path is NCCL's (docs/design.md "Communication": nothing home-made on the data path).
//
// Protocol: rank 0 listens on MASTER_ADDR at the exchange port; every other rank connects (retrying until the
// deadline, since rank 0 may start later), sends a 12-byte hello (magic, its rank, the world size), and
// receives the blob. Rank 0 checks each hello (a wrong world size, a rank out of range or a rank seen
// twice is an error naming it) and replies to all once every rank has arrived. Any rank that cannot
// finish by the deadline fails with DeadlineExceeded naming the address and the ranks still missing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/base/env.h"

namespace strata::comm {

struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  // Where rank 0 serves the exchange: STRATA_BOOTSTRAP_PORT, else MASTER_PORT + 1. Not MASTER_PORT
  // itself: torchrun's agent keeps its own rendezvous store listening there for the whole job.
  int exchange_port = 0;
};

// Validates the variables: all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT present (LOCAL_RANK
// defaults to RANK; STRATA_BOOTSTRAP_PORT to MASTER_PORT + 1), integers in range; errors name the
// variable and its value. NotFound when none of the torchrun variables is set (not a torchrun launch).
absl::StatusOr<TorchrunEnv> ParseTorchrunEnv(const env::TorchrunVars& vars);

// The torchrun launch this process belongs to, read from the environment: NotFound unless WORLD_SIZE is
// set and no MPI launcher started the process (env::MpiLauncherWorldSize; Note [Launchers] in
// runtime/comm/launcher.cc), else ParseTorchrunEnv's result.
absl::StatusOr<TorchrunEnv> TorchrunLaunch();

// Rank 0 passes the blob; the others receive it. Blocks up to `timeout_ms`.
absl::StatusOr<std::string> ExchangeBlob(const TorchrunEnv& env, const std::string& blob, int64_t timeout_ms);

}  // namespace strata::comm
