// Helpers of the C ABI tests: run one body per rank over an in-process strata_comm group (each rank on
// its own thread, as the in-process back-end requires), check an error's code and message, and build a
// small two-unit model through the C ABI.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/strata.h"

namespace strata::capi_test {

// Expects `code` to be `want`, and the last error to name the function `fn` and contain `text`.
#define EXPECT_STRATA_ERROR(call, want, text)                                                         \
  do {                                                                                                \
    const strata_status got_ = (call);                                                                \
    const std::string fn_ = std::string(#call).substr(0, std::string(#call).find('('));               \
    EXPECT_EQ(got_, (want)) << #call << " returned " << strata_status_name(got_) << ": " << strata_last_error(); \
    EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr(fn_ + ": ")) << #call;         \
    EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr(text)) << #call;               \
  } while (0)

#define EXPECT_STRATA_OK(call) EXPECT_EQ((call), STRATA_OK) << #call << ": " << strata_last_error()
#define ASSERT_STRATA_OK(call) ASSERT_EQ((call), STRATA_OK) << #call << ": " << strata_last_error()

// Runs body(rank, comm) on `world` threads over a fresh in-process group, then destroys the group.
template <typename Body>
void RunCRanks(int world, Body body) {
  std::vector<strata_comm*> comms(world, nullptr);
  ASSERT_STRATA_OK(strata_comm_create_in_process(world, comms.data()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, comms[r]); });
  for (std::thread& t : threads) t.join();
  for (strata_comm* c : comms) EXPECT_STRATA_OK(strata_comm_destroy(c));
}

// The test model: unit "a" (w[8,4] decayed, uniform; b[8] zeros) and unit "b" (w[2,8] normal;
// b[2] constant 0.1).
inline const int64_t kShapeAW[] = {8, 4};
inline const int64_t kShapeAB[] = {8};
inline const int64_t kShapeBW[] = {2, 8};
inline const int64_t kShapeBB[] = {2};

inline strata_param_spec Spec(const char* name, const int64_t* shape, int ndim, int decay, int init, float value) {
  strata_param_spec s = STRATA_PARAM_SPEC_INIT;
  s.name = name;
  s.shape = shape;
  s.ndim = ndim;
  s.weight_decay = decay;
  s.init = init;
  s.init_value = value;
  return s;
}

// Registers units a and b (ids 0 and 1); returns the first failing status.
inline strata_status RegisterModel(strata_engine* e) {
  const strata_param_spec a[2] = {Spec("w", kShapeAW, 2, 1, STRATA_INIT_UNIFORM, 0.5f),
                                  Spec("b", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0)};
  const strata_param_spec b[2] = {Spec("w", kShapeBW, 2, 1, STRATA_INIT_NORMAL, 0.3f),
                                  Spec("b", kShapeBB, 1, 0, STRATA_INIT_CONSTANT, 0.1f)};
  strata_status s = strata_engine_register_unit(e, "a", a, 2, nullptr);
  return s != STRATA_OK ? s : strata_engine_register_unit(e, "b", b, 2, nullptr);
}

// Creates an engine over `comm` with `json`, registers the model and (if `finalize`) finalizes.
inline strata_status MakeEngine(strata_comm* comm, const char* json, bool finalize, strata_engine** out) {
  strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
  o.config_json = json;
  strata_status s = strata_engine_create(comm, &o, out);
  if (s == STRATA_OK) s = RegisterModel(*out);
  if (s == STRATA_OK && finalize) s = strata_engine_finalize(*out);
  return s;
}

}  // namespace strata::capi_test
