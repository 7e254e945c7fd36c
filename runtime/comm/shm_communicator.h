// The shared-memory back-end: the ranks of one host exchange host buffers through one shared segment
// (docs/decisions/0053-shared-memory-host-transport.md). It is made collectively over any communicator of
// those ranks, used only as a bootstrap (torch's gloo through the foreign back-end under torchrun, MPI in
// the tests): the ranks check that they are on one host, one creates the segment, all map it, and it is
// unlinked before the first collective, so nothing is left behind when a rank dies.
//
// Note [Shared-memory rounds]. Every collective is a sequence of rounds. In round k each rank copies its
// part of the data (at most `slot_bytes`) into its own slot of the segment, with a header saying which
// collective it is, and publishes k by its `posted` counter; once every rank posted k, each reads what
// it needs from every slot and publishes that it is `done` with k. A rank may write its slot for round
// k only when every rank is done with round k - 2: each rank has two slots, used by alternate rounds, so
// a rank copies in round k + 1 while a slow peer still reads round k. The counters only grow, across the
// collectives of a communicator, so the ranks agree on a round's number as long as they agree on the
// collectives. Every collective has at least one round (a barrier or a count of 0 moves only the
// header), and the first round's headers are compared: another collective, count, dtype, op or root on
// any rank is InvalidArgument naming it, on every rank alike. Waits spin briefly, then sleep on a futex
// in the segment that every publication rings; each wait is bounded by the collective's deadline
// (Options::timeout_ms, one for all its rounds), and a timeout names the ranks that had not posted.
// Note [Failure notices]: each rank has a flag and a message in the segment; a wait that is not over
// when a peer's flag rises polls 200 ms more (the peer may have joined the collective before failing),
// then ends with the notice. A rank that times out raises its own flag, so that a peer arriving late
// fails at once instead of at its own deadline, and a peer whose process no longer exists (its pid,
// checked when all ranks share a pid namespace) is named the same way within about 100 ms.
//
// Note [Shared-memory sums]. The sums are the MPI back-end's, term for term, so a job gives the same bits
// whichever host transport it runs on: a block of 1 MiB or more, at up to 8 ranks, is summed in rank order
// (mpi_communicator.cc: Note [Reduce-scatter over point to point], Note [All-reduce over point to
// point]); a smaller one as Open MPI's own collective sums it, (r0 + r1) + (r2 + r3) ..., the pairwise
// tree that python/strata/_torch_comm.py's ordered_sum also follows. bf16 and fp16 add in fp32 and round
// after each addition (AccumulateInto). An all-reduce sums blocks of ceil(count / size) elements, each on
// the rank that owns it, then gathers them, as the MPI back-end does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

struct ShmConfig {
  // One slot's bytes (Note [Shared-memory rounds]): each rank has two; the segment holds 2 * size slots.
  size_t slot_bytes = size_t{1} << 20;
  // This rank's host, as the ranks compare it: empty means this machine's boot id and host name. Tests
  // set it to play ranks on different hosts.
  std::string host_id;
  // The pid the peers check this rank's liveness by: 0 means this process's. Tests set it to play a dead rank.
  int64_t pid = 0;
};

// Collective over `bootstrap`'s ranks (its rank and size become this communicator's), from the issuing
// thread, with nothing of `bootstrap` queued: a communicator over a shared segment, with `options`.
// FailedPrecondition on every rank when the ranks are not all on one host (the message names them), or
// when a rank cannot create or map the segment (it names the rank and /dev/shm). The bootstrap is used
// only here; the result does not refer to it.
absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Communicator& bootstrap, const Options& options,
                                                                    const ShmConfig& config = {});

// This machine's identity as CreateShmCommunicator compares it: /proc/sys/kernel/random/boot_id and the
// host name.
std::string ThisHostId();

}  // namespace strata::comm
