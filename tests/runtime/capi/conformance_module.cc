// libstrata_conformance.so, for tests/python/test_foreign_conformance.py: the Communicator conformance suite
// (tests/runtime/comm/comm_conformance.h) over a foreign communicator whose callbacks come from the process that
// loads it: strata._torch_comm's, over torch.distributed's gloo (docs/decisions/0033). The module carries its own
// copy of the C ABI (hidden, as libstrata.so's is) and exports one function.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "runtime/capi/capi_internal.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/comm/comm_conformance.h"

namespace strata::comm::conformance {
namespace {

strata_comm* g_root = nullptr;  // set by strata_test_conformance for the duration of RUN_ALL_TESTS

class GlooConformance : public ::testing::TestWithParam<size_t> {};

// Each case on a Dup of the root (collective: a split_group of torch.distributed), as comm_mpi_test makes a
// fresh world communicator per case.
TEST_P(GlooConformance, Passes) {
  ASSERT_NE(g_root, nullptr);
  auto dup = g_root->comm->Dup(Cases()[GetParam()].name);
  ASSERT_TRUE(dup.ok()) << dup.status();
  device::HostDevice dev;
  auto stream = dev.CreateStream("case");
  ASSERT_TRUE(stream.ok()) << stream.status();
  RankHarness h{**dup, dev, **stream};
  Cases()[GetParam()].body(h);
  static_cast<void>((*stream)->Synchronize());  // the error cases leave a failed stream
  stream->reset();  // before the communicator
}

INSTANTIATE_TEST_SUITE_P(AllCases, GlooConformance, ::testing::Range(size_t{0}, Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return Cases()[info.param].name; });

}  // namespace
}  // namespace strata::comm::conformance

// Collective: creates the foreign communicator over `foreign` (timeout `timeout_ms`) and runs the suite's cases
// that match the gtest filter `filter` on it. Returns RUN_ALL_TESTS's result, or 2 when the communicator could not
// be made (the reason on stderr). The communicator is left to the process's exit: a notice case abandons calls.
extern "C" __attribute__((visibility("default"))) int strata_test_conformance(const strata_foreign_comm* foreign,
                                                                             int64_t timeout_ms, const char* filter) {
  strata_comm* root = nullptr;
  if (strata_comm_create_foreign(foreign, timeout_ms, &root) != STRATA_OK) {
    std::fprintf(stderr, "strata_comm_create_foreign: %s\n", strata_last_error());
    return 2;
  }
  strata::comm::conformance::g_root = root;
  std::string name = "conformance", flag = std::string("--gtest_filter=") + (filter != nullptr ? filter : "*");
  char* argv[] = {name.data(), flag.data(), nullptr};
  int argc = 2;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
