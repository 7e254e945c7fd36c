// The in-process back-end: N ranks as N threads of one process, for fast unit tests of everything above
// the communicator. Collectives rendezvous in shared memory; each rank computes its own result from the
// peers' buffers (reductions always sum in rank order 0..N-1, so results are deterministic).
// Timeouts and mismatches behave as the Communicator contract says; a rank that never arrives is named.
// Split() makes new rendezvous for the groups; they share the world's lock and its abort, so Abort() on
// any communicator fails the later collectives of every group split from the same world.
#pragma once

#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"

namespace strata::comm {

// Creates `world_size` communicators, one per rank, sharing one rendezvous. Hand communicator r to the
// thread playing rank r.
std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int world_size, const Options& options);

}  // namespace strata::comm
