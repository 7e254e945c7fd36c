#include "runtime/comm/shard_groups.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace strata::comm {

absl::StatusOr<GroupSplit> ContiguousGroups(int world_size, int rank, int group_size) {
  if (group_size < 1 || group_size > world_size || world_size % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard group size ", group_size, " does not divide the world of ",
                                                   world_size, " ranks; pick a divisor of ", world_size));
  }
  GroupSplit g;
  g.group_size = group_size;
  g.replicas = world_size / group_size;
  g.shard_color = rank / group_size;
  g.shard_key = rank;
  g.replica_color = rank % group_size;
  g.replica_key = rank;
  return g;
}

absl::StatusOr<GroupSplit> GroupsByName(const std::vector<std::string>& hosts, int rank) {
  // Hosts numbered in order of their first rank; a rank's shard rank is its place among its host's ranks.
  std::map<std::string, int> index;
  std::vector<int> count;
  int shard_rank = 0;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    auto [it, fresh] = index.emplace(hosts[r], static_cast<int>(count.size()));
    if (fresh) count.push_back(0);
    if (r == rank) shard_rank = count[it->second];
    ++count[it->second];
  }
  if (std::adjacent_find(count.begin(), count.end(), std::not_equal_to<int>()) != count.end()) {
    std::vector<std::string> each;
    for (const auto& [name, i] : index) each.push_back(absl::StrCat(name, ": ", count[i]));
    return absl::FailedPreconditionError(absl::StrCat(
        "shard_group_size \"node\" needs the same number of ranks on every host, but they hold ",
        absl::StrJoin(each, ", "), "; give an integer shard_group_size instead"));
  }
  GroupSplit g;
  g.group_size = count.empty() ? 1 : count[0];
  g.replicas = static_cast<int>(count.size());
  g.shard_color = index.at(hosts[rank]);
  g.shard_key = rank;
  g.replica_color = shard_rank;
  g.replica_key = rank;
  return g;
}

absl::StatusOr<GroupSplit> GroupsByHost(Communicator& world, device::Stream& stream, const std::string& node) {
  // A fixed-size, NUL-padded name per rank (POSIX host names are at most 255 bytes).
  constexpr size_t kNameBytes = 256;
  std::vector<char> mine(kNameBytes, 0), all(kNameBytes * static_cast<size_t>(world.size()), 0);
  if (node.empty()) {
    STRATA_RETURN_IF_ERROR(STRATA_SYSCALL(::gethostname(mine.data(), kNameBytes - 1)));
  } else {
    node.copy(mine.data(), kNameBytes - 1);
  }
  STRATA_RETURN_IF_ERROR(AllGatherBytes(world, mine.data(), all.data(), kNameBytes, stream).Wait());
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* name = all.data() + static_cast<size_t>(r) * kNameBytes;
    hosts.emplace_back(name, strnlen(name, kNameBytes));
  }
  return GroupsByName(hosts, world.rank());
}

}  // namespace strata::comm
