// The timing and the wording of the diagnosis that follows a stuck collective (MPI back-end), kept pure
// so that it can be tested without processes.
//
// Note [Stall budget]: a collective that does not complete is diagnosed by a liveness check (every rank
// that times out pings every other rank on a control communicator and waits for their pings). Both
// phases fit inside the configured timeout: the collective is waited for `collective_ms`, then the
// check runs `liveness_ms`, so the error arrives when the configured timeout has passed, not up to twice
// it, and it reports the time actually measured.
//
// Note [Late answers]: a rank answers the check only once its own collective has timed out. A peer that
// answers at once timed out with us (the ranks wait in different collectives, or one is far behind); a
// peer that answers only after `late_ms` was not running for that long (stopped, e.g. SIGSTOP, then
// resumed, or descheduled) and is named with the delay measured; a peer that never answers is named as
// not responding.
//
// Note [Own stop]: a waiting rank polls every fraction of a millisecond, so the largest gap between two
// consecutive polls of one wait (the first measured from the wait's start) is how long the rank itself
// did not run during it: stopped (e.g. SIGSTOP) or descheduled. It is the whole stop when the stop fell
// inside the wait, and a lower bound when the stop began before (hence "at least"). The overshoot past
// the deadline is not that measure: a stop that began early in the wait overshoots by the stop less
// what was left of the budget. Such a rank finds its peers' answers already waiting (they timed out
// while it was not running), so "every rank answered at once" says nothing about the order of
// collectives; the peers may have aborted meanwhile (Open MPI resumes a stopped rank with SIGCONT
// when it kills the job, so this rank may speak only then).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::comm {

struct StallBudget {
  int64_t collective_ms = 0;  // wait for the collective itself
  int64_t liveness_ms = 0;    // then the liveness check; the two add up to the configured timeout
  int64_t late_ms = 0;        // an answer later than this is reported as late (Note [Late answers])
};

StallBudget SplitTimeout(int64_t timeout_ms);

// answer_ms[p]: when peer p's answer arrived, in ms after the check began, or -1 if it never did within
// `waited_ms`; the entry of `me` is ignored. `self_stopped`: this rank itself was found not to have run
// (Note [Own stop]); then prompt answers are not read as a disagreement on the order of collectives.
std::string DescribeLiveness(const std::vector<int64_t>& answer_ms, int me, int64_t waited_ms, int64_t late_ms,
                             bool self_stopped = false);

// True when a wait's largest gap between polls (`max_gap_ms`, Note [Own stop]) exceeds `late_ms`.
bool WasStopped(int64_t max_gap_ms, int64_t late_ms);

// "" unless WasStopped; then a sentence naming the gap, to put before the liveness result.
std::string DescribeOwnStop(int64_t max_gap_ms, int64_t late_ms);

}  // namespace strata::comm
