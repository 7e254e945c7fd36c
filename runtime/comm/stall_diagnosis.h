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
// `waited_ms`; the entry of `me` is ignored.
std::string DescribeLiveness(const std::vector<int64_t>& answer_ms, int me, int64_t waited_ms, int64_t late_ms);

// "" unless this rank's own wait overshot its budget by more than `late_ms` (a waiting rank polls every
// fraction of a millisecond, so it was itself not running: stopped, then resumed). Then a sentence that
// says so, to put before the liveness result (whose "answered at once" would otherwise mislead).
std::string DescribeOwnOvershoot(int64_t waited_ms, int64_t budget_ms, int64_t late_ms);

}  // namespace strata::comm
