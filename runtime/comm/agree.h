// Agreement across the ranks of a communicator, for errors that must be the same on every rank: each
// rank's value of a list of settings (Note [One configuration]), or each rank's outcome of a local phase
// (Note [Agreed outcomes]). Small all-gathers of text on the caller's communicator, whose deadline
// bounds them, so a rank that never arrives is a timeout naming it, never a hang.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/comm/communicator.h"

namespace strata::comm {

// For errors about ranks that disagree: each distinct value of `per_rank` (indexed by rank) with the ranks
// that hold it, in order of first appearance, and "rank 2" / "ranks 0,1" for a list of ranks.
template <typename T>
std::vector<std::pair<T, std::vector<int>>> RanksByValue(const std::vector<T>& per_rank) {
  std::vector<std::pair<T, std::vector<int>>> out;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& v) { return v.first == per_rank[r]; });
    if (it == out.end()) out.push_back({per_rank[r], {r}});
    else it->second.push_back(r);
  }
  return out;
}
inline std::string RanksText(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() > 1 ? "ranks " : "rank ", absl::StrJoin(ranks, ","));
}

// Every rank's text (at most 1 MiB each), in rank order: two all-gathers (lengths, then padded texts).
absl::StatusOr<std::vector<std::string>> AllGatherText(Communicator& comm, const std::string& mine,
                                                       device::Stream& stream);

// Note [One configuration]: `fields` are (key, value) in an order every rank shares. OK when every rank
// has the same values; otherwise FailedPrecondition (IsAgreedFailure) on every rank alike: "<what> differs across
// ranks: KEY is V on rank 0 but W on rank 1. <remedy>", for the first key that differs.
absl::Status AgreeOnFields(const std::vector<std::pair<std::string, std::string>>& fields, absl::string_view what,
                           absl::string_view remedy, Communicator& comm, device::Stream& stream);

// Note [Agreed outcomes]: each rank's status of a phase it ran alone (checking its outputs, reading its
// data). OK when every rank succeeded; otherwise, on every rank, an error naming each failing rank and its
// cause: this rank's own status (annotated with the others' when they failed too), or, on a rank that
// succeeded, FailedPrecondition "<phase>: rank 1 failed: <cause>".
// The error (not a communication failure) carries IsAgreedFailure: every rank returns it alike, so the
// caller may end cleanly, with no abort and no notice to the peers.
absl::Status AgreeOnOutcome(const absl::Status& mine, absl::string_view phase, Communicator& comm,
                            device::Stream& stream);
bool IsAgreedFailure(const absl::Status& s);

}  // namespace strata::comm
