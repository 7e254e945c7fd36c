// Note [Shard groups] (docs/design.md "Hybrid sharding"). A world of N ranks is split into shard groups of G
// ranks, replicated N / G times: state is sharded within a shard group (its gathers and reduce-scatters
// stay there) and each shard-group rank s has a replica group, the rank s of every shard group, over
// which its shard is all-reduced. G = N is plain ZeRO (one group, no replicas); G = 1 is data
// parallelism. These are the Communicator::Split arguments that make both groups, computed once.
//
// Two ways to form the groups:
//   ContiguousGroups(G)  rank r is shard rank r % G of shard group r / G, in replica group r % G.
//   GroupsByHost         the ranks that share a host form one shard group (HSDP / MiCS within a node),
//                        ranked by world rank; each host must hold the same number of ranks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

struct GroupSplit {
  int group_size = 1;  // G: ranks per shard group
  int replicas = 1;    // N / G: shard groups, i.e. ranks per replica group
  int shard_color = 0, shard_key = 0;      // Split() of the world into this rank's shard group
  int replica_color = 0, replica_key = 0;  // Split() of the world into this rank's replica group
};

// InvalidArgument unless 1 <= group_size <= world_size and group_size divides world_size.
absl::StatusOr<GroupSplit> ContiguousGroups(int world_size, int rank, int group_size);

// From every rank's host name (`hosts[r]` for world rank r): pure, for GroupsByHost and its tests.
// FailedPrecondition naming the hosts and their rank counts when they differ.
absl::StatusOr<GroupSplit> GroupsByName(const std::vector<std::string>& hosts, int rank);

// All-gathers this process's node name over `world` on `stream` (collective, blocks within the communicator's
// deadline), then GroupsByName. The name is `node` when given (torchrun's node of this rank: the engine's
// ResolveShardGroups), else the host name (gethostname).
absl::StatusOr<GroupSplit> GroupsByHost(Communicator& world, device::Stream& stream, const std::string& node = "");

}  // namespace strata::comm
