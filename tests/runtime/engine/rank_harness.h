// Runs one body per rank on its own thread over an in-process communicator group, and collects each
// rank's status. The engine tests use it to exercise every stage at several world sizes in one process.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/in_process.h"

namespace strata::testing {

inline std::vector<absl::Status> RunRanks(int world, const comm::Options& options,
                                          const std::function<absl::Status(int rank, comm::Communicator&)>& body) {
  auto comms = comm::CreateInProcessGroup(world, options);
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { results[r] = body(r, *comms[r]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace strata::testing
