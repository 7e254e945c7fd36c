#include "runtime/comm/stall_diagnosis.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::comm {

StallBudget SplitTimeout(int64_t timeout_ms) {
  StallBudget b;
  const int64_t timeout = std::max<int64_t>(timeout_ms, 1);
  b.liveness_ms = std::clamp<int64_t>(timeout / 4, 1, 5000);
  b.collective_ms = std::max<int64_t>(timeout - b.liveness_ms, 0);
  b.late_ms = std::max<int64_t>(b.liveness_ms / 10, 20);
  return b;
}

std::string DescribeLiveness(const std::vector<int64_t>& answer_ms, int me, int64_t waited_ms, int64_t late_ms,
                             bool self_stopped) {
  std::vector<int> missing, late;
  std::vector<std::string> late_text;
  for (int p = 0; p < static_cast<int>(answer_ms.size()); ++p) {
    if (p == me) continue;
    if (answer_ms[p] < 0) {
      missing.push_back(p);
    } else if (answer_ms[p] > late_ms) {
      late.push_back(p);
      late_text.push_back(absl::StrCat("rank ", p, " did not answer for ", answer_ms[p], " ms, then answered"));
    }
  }
  std::vector<std::string> parts;
  if (!missing.empty()) {
    parts.push_back(absl::StrCat("rank(s) ", absl::StrJoin(missing, ","),
                                 " did not respond to a liveness check within ", waited_ms,
                                 " ms (dead, stopped or stuck outside collectives)"));
  }
  if (!late.empty()) {
    parts.push_back(absl::StrCat(absl::StrJoin(late_text, "; "),
                                 " (stopped or descheduled, then resumed, or that far behind)"));
  }
  if (self_stopped) {
    parts.push_back(parts.empty()
                        ? absl::StrCat("every peer answered a liveness check within ", late_ms,
                                       " ms, having timed out while this rank was not running: the cause is this "
                                       "rank's own stop, not the order of collectives, and the peers may have "
                                       "aborted meanwhile")
                        : "the peers may have timed out and aborted while this rank was not running");
    return absl::StrJoin(parts, "; ");
  }
  if (parts.empty()) {
    return absl::StrCat("every rank answered a liveness check within ", late_ms,
                        " ms, so the ranks disagree on the order of collectives or one is far behind");
  }
  return absl::StrJoin(parts, "; ");
}

bool WasStopped(int64_t max_gap_ms, int64_t late_ms) { return max_gap_ms > late_ms; }

std::string DescribeOwnStop(int64_t max_gap_ms, int64_t late_ms) {
  if (!WasStopped(max_gap_ms, late_ms)) return "";
  return absl::StrCat("this rank itself did not run for at least ", max_gap_ms,
                      " ms of this wait (stopped, e.g. SIGSTOP, or descheduled, then resumed); ");
}

}  // namespace strata::comm
