// Every error path of the C ABI returns a code and a message naming the function: NULL handles and
// outputs, bad JSON configs, bad parameter specs, versioned-struct mismatches, a unit used before
// finalize, bad unit / parameter ids, non-finite values, calls out of order, unimplemented back-ends;
// and the last-error message is per thread and cleared by a successful call.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/capi/capi_test_util.h"

namespace strata::capi_test {
namespace {

constexpr strata_status kInvalid = STRATA_ERR_INVALID_ARGUMENT;
constexpr strata_status kOrder = STRATA_ERR_FAILED_PRECONDITION;
constexpr strata_status kRange = STRATA_ERR_OUT_OF_RANGE;

TEST(CApiErrors, VersionsAndStatusNames) {
  EXPECT_EQ(strata_abi_version(), static_cast<uint32_t>(STRATA_ABI_VERSION));
  EXPECT_STREQ(strata_version_string(), "0.1.0");
  EXPECT_STREQ(strata_status_name(STRATA_OK), "STRATA_OK");
  EXPECT_STREQ(strata_status_name(STRATA_ERR_VERSION), "STRATA_ERR_VERSION");
  EXPECT_STREQ(strata_status_name(STRATA_ERR_ALREADY_EXISTS), "STRATA_ERR_ALREADY_EXISTS");
  EXPECT_STREQ(strata_status_name(STRATA_ERR_PEER_FAILED), "STRATA_ERR_PEER_FAILED");
  EXPECT_STREQ(strata_status_name(12345), "STRATA_ERR_UNKNOWN");
}

TEST(CApiErrors, NullHandlesAreInvalidArgument) {
  strata_engine* e = nullptr;
  strata_comm* c = nullptr;
  int32_t i = 0;
  float f = 0;
  void* p = nullptr;
  float* g = nullptr;
  strata_stats st = STRATA_STATS_INIT;
  strata_param_info info = STRATA_PARAM_INFO_INIT;
  EXPECT_STRATA_ERROR(strata_comm_rank(c, &i), kInvalid, "comm is NULL");
  EXPECT_STRATA_ERROR(strata_comm_size(c, &i), kInvalid, "comm is NULL");
  EXPECT_STRATA_ERROR(strata_comm_abort(c, "x"), kInvalid, "comm is NULL");
  EXPECT_STRATA_ERROR(strata_engine_create(c, nullptr, &e), kInvalid, "comm is NULL");
  EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", nullptr, 1, nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_finalize(e), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_num_units(e, &i), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_num_params(e, 0, &i), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_param_info(e, 0, 0, &info), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_begin_micro_batch(e), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_end_micro_batch(e), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_begin_forward(e, 0, nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_end_forward(e, 0), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_begin_backward(e, 0, nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_end_backward(e, 0), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_param(e, 0, 0, &p), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_grad(e, 0, 0, &g), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_zero_grad(e), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_step(e, nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_loss_scale(e, &f), kInvalid, "engine is NULL");
  double d = 0;
  EXPECT_STRATA_ERROR(strata_engine_lr(e, &d), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, 0, &f, 1), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, 0, &f, 1), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, "/tmp/x", nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_load_checkpoint(e, "/tmp/x", nullptr), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_get_stats(e, &st), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_engine_reset_peak_memory(e), kInvalid, "engine is NULL");
  EXPECT_STRATA_ERROR(strata_comm_create_mpi_world(nullptr), kInvalid, "out is NULL");
  EXPECT_STRATA_ERROR(strata_comm_create_mpi(0, nullptr), kInvalid, "out is NULL");
  EXPECT_STRATA_ERROR(strata_comm_create_in_process(2, nullptr), kInvalid, "out_comms is NULL");
  EXPECT_STRATA_ERROR(strata_comm_create_shm(nullptr, 0, &c), kInvalid, "comm is NULL");
  EXPECT_STRATA_ERROR(strata_comm_create_in_process(0, &c), kInvalid, "world_size 0");
  // INT32_MAX ranks were allocated (and the process OOM-killed) before anything was checked.
  EXPECT_STRATA_ERROR(strata_comm_create_in_process(INT32_MAX, &c), kInvalid,
                      "world_size 2147483647 is above the maximum of 1048576");
  // Destroying NULL is a no-op, like free().
  EXPECT_STRATA_OK(strata_engine_destroy(nullptr));
  EXPECT_STRATA_OK(strata_comm_destroy(nullptr));
}

TEST(CApiErrors, NullOutputsAndBadArgumentsOnALiveEngine) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, true, &e));
    float buf[32];
    EXPECT_STRATA_ERROR(strata_engine_create(comm, nullptr, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_comm_rank(comm, nullptr), kInvalid, "out_rank is NULL");
    EXPECT_STRATA_ERROR(strata_engine_num_units(e, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_param_info(e, 0, 0, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_get_stats(e, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_loss_scale(e, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_lr(e, nullptr), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, 0, nullptr, 32), kInvalid, "out is NULL");
    EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, 0, buf, 31), kInvalid, "has 32 elements, count is 31");
    EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, 1, buf, 32), kInvalid, "has 8 elements, count is 32");
    EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, nullptr, nullptr), kInvalid, "root_dir is NULL");
    EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, "/tmp/x", "{oops"), kInvalid, "not a JSON document");
    EXPECT_STRATA_ERROR(strata_engine_load_checkpoint(e, nullptr, nullptr), kInvalid, "dir is NULL");
    EXPECT_STRATA_ERROR(strata_engine_load_checkpoint(e, "/nonexistent/ckpt", nullptr), STRATA_ERR_NOT_FOUND,
                        "/nonexistent/ckpt");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, BadJsonConfigIsInvalidArgumentNamingTheProblem) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
    o.config_json = "{\"zero_optimization\": {\"stage\": 3}";  // unterminated
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), kInvalid, "options.config_json");
    EXPECT_EQ(e, nullptr);
    o.config_json = "{\"zero_optimisation\": {\"stage\": 3}}";
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), kInvalid, "zero_optimization");
    o.config_json = "{\"zero_optimization\": {\"stage\": 7}}";
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), kInvalid, "zero_optimization.stage");
    o.config_json = "";  // empty means defaults
    ASSERT_STRATA_OK(strata_engine_create(comm, &o, &e));
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

// What the CUDA / NCCL entry points answer depends on the build (STRATA_TEST_CUDA / _NCCL) and, for a CUDA
// device, on whether a GPU is visible; the GPU path itself is tests/runtime/capi/capi_cuda_test.cc.
TEST(CApiErrors, CudaAndNcclEntryPointsSayWhatIsMissing) {
  strata_comm* c = reinterpret_cast<strata_comm*>(0x1);
#if STRATA_TEST_NCCL
  EXPECT_STRATA_ERROR(strata_comm_create_nccl(nullptr, &c), kInvalid, "nccl_comm");
#else
  EXPECT_STRATA_ERROR(strata_comm_create_nccl(nullptr, &c), STRATA_ERR_UNIMPLEMENTED, "built without NCCL");
#endif
  EXPECT_EQ(c, nullptr);
  // Not a torchrun launch (the test runs with none of its variables): refused before any socket or NCCL.
  c = reinterpret_cast<strata_comm*>(0x1);
  EXPECT_STRATA_ERROR(strata_comm_create_torchrun(0, nullptr), kInvalid, "out is NULL");
#if STRATA_TEST_NCCL
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  EXPECT_STRATA_ERROR(strata_comm_create_torchrun(0, &c), STRATA_ERR_FAILED_PRECONDITION, "not a torchrun launch");
#else
  EXPECT_STRATA_ERROR(strata_comm_create_torchrun(0, &c), STRATA_ERR_UNIMPLEMENTED, "built without NCCL");
#endif
  EXPECT_EQ(c, nullptr);
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
    o.device = STRATA_DEVICE_CUDA;
#if STRATA_TEST_CUDA
    const strata_status s = strata_engine_create(comm, &o, &e);
    if (s == STRATA_OK) {  // a GPU is visible here
      EXPECT_STRATA_OK(strata_engine_destroy(e));
    } else {
      EXPECT_EQ(s, STRATA_ERR_FAILED_PRECONDITION) << strata_last_error();
      EXPECT_THAT(std::string(strata_last_error()), ::testing::HasSubstr("no CUDA device is visible"));
    }
#else
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), STRATA_ERR_UNIMPLEMENTED, "built without CUDA");
#endif
    o.device = 7;
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), kInvalid, "options.device is 7");
  });
}

TEST(CApiErrors, VersionedStructsAreChecked) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
    o.struct_size = 4;
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), STRATA_ERR_VERSION, "STRATA_*_INIT");
    o = STRATA_ENGINE_OPTIONS_INIT;
    o.version = 0;
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &o, &e), STRATA_ERR_VERSION, "version 0");
    // A newer caller's larger struct: unknown trailing fields must be zero.
    struct Newer {
      strata_engine_options base;
      uint64_t newer_field;
    } newer{STRATA_ENGINE_OPTIONS_INIT, 5};
    newer.base.struct_size = sizeof(Newer);
    EXPECT_STRATA_ERROR(strata_engine_create(comm, &newer.base, &e), STRATA_ERR_VERSION, "does not know");
    newer.newer_field = 0;
    ASSERT_STRATA_OK(strata_engine_create(comm, &newer.base, &e));
    ASSERT_STRATA_OK(RegisterModel(e));
    // Output structs: a newer caller's fields beyond this library's layout are left alone.
    struct NewerInfo {
      strata_param_info base;
      uint64_t newer_field;
    } info{STRATA_PARAM_INFO_INIT, 0xfeed};
    info.base.struct_size = sizeof(NewerInfo);
    info.base.version = STRATA_ABI_VERSION + 1;
    ASSERT_STRATA_OK(strata_engine_param_info(e, 1, 0, &info.base));
    EXPECT_EQ(info.base.struct_size, sizeof(NewerInfo));
    EXPECT_EQ(info.base.version, static_cast<uint32_t>(STRATA_ABI_VERSION)) << "the layout actually written";
    EXPECT_STREQ(info.base.name, "w");
    EXPECT_EQ(info.base.numel, 16u);
    EXPECT_EQ(info.newer_field, 0xfeedu);
    strata_param_info bad = STRATA_PARAM_INFO_INIT;
    bad.struct_size = 8;
    EXPECT_STRATA_ERROR(strata_engine_param_info(e, 1, 0, &bad), STRATA_ERR_VERSION, "struct_size 8");
    // Arrays of specs: every element must have the stride of the first.
    strata_param_spec specs[2] = {Spec("w", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0),
                                  Spec("v", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0)};
    specs[1].struct_size = 8;
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "c", specs, 2, nullptr), STRATA_ERR_VERSION, "params[1]");
    // A later element claiming more bytes than the stride is refused before its unknown bytes are scanned
    // (they would lie past the array: ASan saw the heap over-read; tests/fuzz/regressions/capi_specs).
    auto* tight = static_cast<strata_param_spec*>(std::malloc(2 * sizeof(strata_param_spec)));
    tight[0] = specs[0];
    tight[1] = Spec("v", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0);
    tight[1].struct_size = sizeof(strata_param_spec) + 64;
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "c", tight, 2, nullptr), STRATA_ERR_VERSION,
                        "every element of the array must have the same layout");
    std::free(tight);
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, BadParameterSpecsAreInvalidArgument) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(strata_engine_create(comm, nullptr, &e));
    const int64_t negative[] = {4, -2};
    strata_param_spec s = Spec(nullptr, kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "params[0].name is NULL");
    s = Spec("w", kShapeAB, 0, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "params[0].ndim is 0");
    s = Spec("w", nullptr, 1, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "params[0].shape is NULL");
    s = Spec("w", kShapeAB, 1, 0, 42, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "params[0].init is 42");
    s = Spec("w", negative, 2, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "-2");
    // A million extents were accepted (and copied); a non-finite init_value filled the parameter with NaN.
    s = Spec("w", kShapeAB, 1000000, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid,
                        "params[0].ndim is 1000000; it must be <= 64");
    for (const int32_t init : {STRATA_INIT_CONSTANT, STRATA_INIT_NORMAL, STRATA_INIT_UNIFORM}) {
      s = Spec("w", kShapeAB, 1, 0, init, std::nanf(""));
      EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid,
                          "params[0].init_value is nan; it must be finite");
      s = Spec("w", kShapeAB, 1, 0, init, -std::numeric_limits<float>::infinity());
      EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid,
                          "params[0].init_value is -inf; it must be finite");
    }
    s = Spec("w", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 0, nullptr), kInvalid, "num_params is 0");
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, nullptr, &s, 1, nullptr), kInvalid, "name is NULL");
    // Extents whose product overflows 64 bits (it once wrapped to a small unit), or a unit past 2^48 elements.
    const int64_t wraps[] = {int64_t{1} << 32, int64_t{1} << 32, 2};
    s = Spec("w", wraps, 3, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "exceeds 2^48 elements");
    const int64_t huge[] = {int64_t{1} << 40, 512};
    s = Spec("w", huge, 2, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "parameter 'w' (shape [");
    s = Spec("w", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0);
    const strata_param_spec twice[2] = {s, s};
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", twice, 2, nullptr), kInvalid, "w");
    int32_t id = -1;
    ASSERT_STRATA_OK(strata_engine_register_unit(e, "u", &s, 1, &id));
    EXPECT_EQ(id, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "u", &s, 1, nullptr), kInvalid, "registered twice");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, AUnitUsedBeforeFinalizeIsFailedPrecondition) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, /*finalize=*/false, &e));
    void* p = nullptr;
    float buf[32];
    strata_param_info info = STRATA_PARAM_INFO_INIT;
    EXPECT_STRATA_OK(strata_engine_param_info(e, 0, 0, &info));  // the layout is known already
    EXPECT_STRATA_ERROR(strata_engine_begin_forward(e, 0, nullptr), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_begin_backward(e, 0, nullptr), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_end_forward(e, 0), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_param(e, 0, 0, &p), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, 0, buf, 32), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_begin_micro_batch(e), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_step(e, nullptr), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_zero_grad(e), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, "/tmp/x", nullptr), kOrder, "before strata_engine_finalize");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, BadUnitAndParameterIdsAreOutOfRange) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, true, &e));
    void* p = nullptr;
    int32_t n = 0;
    float buf[32];
    strata_param_info info = STRATA_PARAM_INFO_INIT;
    EXPECT_STRATA_ERROR(strata_engine_begin_forward(e, 2, nullptr), kRange, "no unit 2 (2 registered)");
    EXPECT_STRATA_ERROR(strata_engine_begin_backward(e, -1, nullptr), kRange, "no unit -1");
    EXPECT_STRATA_ERROR(strata_engine_end_backward(e, 99), kRange, "no unit 99");
    EXPECT_STRATA_ERROR(strata_engine_num_params(e, 5, &n), kRange, "no unit 5");
    EXPECT_STRATA_ERROR(strata_engine_param_info(e, 0, 2, &info), kRange, "unit 'a' has no parameter 2");
    EXPECT_STRATA_ERROR(strata_engine_param_info(e, 0, -1, &info), kRange, "has no parameter -1");
    EXPECT_STRATA_ERROR(strata_engine_param(e, 1, 3, &p), kRange, "unit 'b' has no parameter 3");
    EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, 9, buf, 32), kRange, "has no parameter 9");
    // INT32_MIN once meant "no parameter" inside the checks and skipped them (then read out of bounds).
    EXPECT_STRATA_ERROR(strata_engine_param_info(e, 0, INT32_MIN, &info), kRange, "has no parameter -2147483648");
    EXPECT_STRATA_ERROR(strata_engine_param(e, 0, INT32_MIN, &p), kRange, "has no parameter -2147483648");
    EXPECT_STRATA_ERROR(strata_engine_grad(e, 0, INT32_MIN, reinterpret_cast<float**>(&p)), kRange,
                        "has no parameter -2147483648");
    EXPECT_STRATA_ERROR(strata_engine_gather_param(e, 0, INT32_MIN, buf, 32), kRange, "has no parameter -2147483648");
    EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, INT32_MIN, buf, 32), kRange, "has no parameter -2147483648");
    EXPECT_STRATA_ERROR(strata_engine_num_params(e, INT32_MIN, &n), kRange, "no unit -2147483648");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

// set_param used to copy NaN / Inf values in and return STRATA_OK; a refused call leaves the parameter as
// it was.
TEST(CApiErrors, NonFiniteSetParamValuesAreInvalidArgumentNamingTheParameter) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, true, &e));
    float before[32], values[32], after[32];
    ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, before, 32));
    for (int i = 0; i < 32; ++i) values[i] = 0.25f;
    values[7] = std::nanf("");
    EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, 0, values, 32), kInvalid,
                        "parameter 'a.w': values[7] is nan; it must be finite");
    values[7] = 0.25f;
    values[31] = std::numeric_limits<float>::infinity();
    EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, 0, values, 32), kInvalid,
                        "parameter 'a.w': values[31] is inf; it must be finite");
    ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, after, 32));
    EXPECT_EQ(std::memcmp(before, after, sizeof before), 0);
    values[31] = 0.25f;
    EXPECT_STRATA_OK(strata_engine_set_param(e, 0, 0, values, 32));
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

// strata_engine_held_range, set_param_range and gather_unit at 2 ranks and stages 0-3: the held ranges cover
// the unit (a partition at stage 3), each rank setting only its own range of a parameter gives the same
// gathered value as set_param of the whole, and the errors name what is wrong.
TEST(CApiErrors, HeldRangesSetParamRangeAndGatherUnit) {
  for (int stage : {0, 1, 2, 3}) {
    const std::string json = "{\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
    RunCRanks(2, [&](int rank, strata_comm* comm) {
      strata_engine* e = nullptr;
      ASSERT_STRATA_OK(MakeEngine(comm, json.c_str(), true, &e));
      uint64_t begin = 0, end = 0;
      ASSERT_STRATA_OK(strata_engine_held_range(e, 0, &begin, &end));
      if (stage == 3) {
        EXPECT_LT(end - begin, 40u) << "stage 3 keeps a part of unit a (40 elements)";
      } else {
        EXPECT_EQ(begin, 0u);
        EXPECT_GE(end, 40u);
      }
      float values[32], whole[32], got[32];
      for (int i = 0; i < 32; ++i) values[i] = 0.5f + i;
      // Only the elements of w (offset 0 in the unit) this rank keeps, the rest of the buffer garbage.
      float mine[32];
      for (int i = 0; i < 32; ++i)
        mine[i] = (i >= static_cast<int>(begin) && i < static_cast<int>(end)) ? values[i] : -7;
      const uint64_t lo = std::min<uint64_t>(begin, 32), hi = std::min<uint64_t>(end, 32);
      for (uint64_t i = lo; i < hi; ++i) ASSERT_EQ(mine[i], values[i]);
      ASSERT_STRATA_OK(strata_engine_set_param_range(e, 0, 0, lo, mine + lo, hi - lo));
      ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, got, 32));
      for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i], values[i]) << "stage " << stage << " element " << i;
      ASSERT_STRATA_OK(strata_engine_set_param(e, 0, 0, values, 32));
      ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, whole, 32));
      EXPECT_EQ(std::memcmp(whole, got, sizeof got), 0);
      float unit[40];
      ASSERT_STRATA_OK(strata_engine_gather_unit(e, 0, unit, 40));
      EXPECT_EQ(std::memcmp(unit, got, sizeof got), 0);
      EXPECT_STRATA_ERROR(strata_engine_gather_unit(e, 0, unit, 39), kInvalid,
                          "unit 'a' has 40 elements up to the end of its last parameter, count is 39");
      EXPECT_STRATA_ERROR(strata_engine_set_param_range(e, 0, 1, 6, values, 3), kInvalid,
                          "parameter 'a.b' has 8 elements; [6, 9) is not within it");
      values[3] = std::nanf("");
      EXPECT_STRATA_ERROR(strata_engine_set_param_range(e, 0, 0, 4, values, 8), kInvalid,
                          "parameter 'a.w': values[7] is nan; it must be finite");
      EXPECT_STRATA_ERROR(strata_engine_held_range(e, 0, nullptr, &end), kInvalid, "begin is NULL");
      EXPECT_STRATA_ERROR(strata_engine_held_range(e, 5, &begin, &end), kRange, "no unit 5");
      (void)rank;
      EXPECT_STRATA_OK(strata_engine_destroy(e));
    });
  }
}

// strata_safetensors_* and strata_engine_load_safetensors at 2 ranks, stages 1 and 3: the loaded parameters
// equal the file's values (BF16 and F32 converted), each rank reads exactly the bytes of the elements it keeps
// (the reader's own count), and every bad argument is an error naming it before any I/O.
TEST(CApiErrors, LoadSafetensorsReadsOnlyTheHeldBytes) {
  for (int stage : {1, 3}) {
    const std::string json = "{\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
    RunCRanks(2, [&](int rank, strata_comm* comm) {
      // b: F32 [8], i: I32 [8], w: BF16 [32], x: F32 [3]; each rank its own copy of the file.
      std::vector<uint16_t> w(32);
      std::vector<float> b(8), x(3, 1.0f);
      for (int k = 0; k < 32; ++k) w[k] = static_cast<uint16_t>(0x3f00 + 3 * k);  // 0.5 ... in BF16
      for (int k = 0; k < 8; ++k) b[k] = -1.25f * k;
      const std::string header =
          R"({"b":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"i":{"dtype":"I32","shape":[8],)"
          R"("data_offsets":[32,64]},"w":{"dtype":"BF16","shape":[4,8],"data_offsets":[64,128]},)"
          R"("x":{"dtype":"F32","shape":[3],"data_offsets":[128,140]}})";
      std::string bytes(8, '\0');
      for (int k = 0; k < 8; ++k) bytes[k] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * k));
      bytes += header;
      bytes.append(reinterpret_cast<const char*>(b.data()), 32).append(32, '\0');
      bytes.append(reinterpret_cast<const char*>(w.data()), 64).append(reinterpret_cast<const char*>(x.data()), 12);
      const std::string path = ::testing::TempDir() + "/capi_load_" + std::to_string(::getpid()) + "_" +
                               std::to_string(stage) + "_" + std::to_string(rank) + ".safetensors";
      { std::ofstream(path, std::ios::binary) << bytes; }
      strata_safetensors* ck = nullptr;
      ASSERT_STRATA_OK(strata_safetensors_open(path.c_str(), &ck));
      size_t n = 0;
      ASSERT_STRATA_OK(strata_safetensors_num_tensors(ck, &n));
      ASSERT_EQ(n, 4u);
      strata_safetensors_tensor t = STRATA_SAFETENSORS_TENSOR_INIT;
      ASSERT_STRATA_OK(strata_safetensors_tensor_info(ck, 2, &t));
      EXPECT_STREQ(t.name, "w");
      EXPECT_STREQ(t.dtype, "BF16");
      ASSERT_EQ(t.ndim, 2);
      EXPECT_EQ(t.shape[0] * t.shape[1], 32);
      EXPECT_EQ(t.data_begin, 64u);
      EXPECT_EQ(t.file_data_bytes, 140u);

      strata_engine* e = nullptr;
      ASSERT_STRATA_OK(MakeEngine(comm, json.c_str(), true, &e));
      const int32_t units[2] = {0, 0}, params[2] = {0, 1};
      const uint64_t tensors[2] = {2, 0};
      strata_load_stats stats = STRATA_LOAD_STATS_INIT;
      ASSERT_STRATA_OK(strata_engine_load_safetensors(e, ck, units, params, tensors, 2, nullptr, &stats));
      uint64_t begin = 0, end = 0;
      ASSERT_STRATA_OK(strata_engine_held_range(e, 0, &begin, &end));
      strata_param_info info = STRATA_PARAM_INFO_INIT;
      ASSERT_STRATA_OK(strata_engine_param_info(e, 0, 1, &info));
      auto held = [&](uint64_t offset, uint64_t numel) {
        const uint64_t lo = std::max(begin, offset), hi = std::min(end, offset + numel);
        return hi > lo ? hi - lo : 0;
      };
      EXPECT_EQ(stats.bytes_read, 2 * held(0, 32) + 4 * held(info.offset_elems, 8)) << "stage " << stage;
      EXPECT_EQ(stats.elements, held(0, 32) + held(info.offset_elems, 8));
      EXPECT_NE(std::string(stats.backend), "");
      float got[32];
      ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, got, 32));
      for (int k = 0; k < 32; ++k) {
        uint32_t bits = static_cast<uint32_t>(w[k]) << 16;
        float want;
        std::memcpy(&want, &bits, 4);
        EXPECT_EQ(got[k], want) << "stage " << stage << " element " << k;
      }
      ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 1, got, 8));
      EXPECT_EQ(std::memcmp(got, b.data(), 32), 0);

      // Pieces (strata_engine_load_safetensors_at): b's 8 elements into w's [0, 8), x's 3 into w's [29, 32); the
      // rest of w keeps its values, and each rank reads only its held part of each piece.
      {
        const int32_t pu[2] = {0, 0}, pp[2] = {0, 0};
        const uint64_t pt[2] = {0, 3}, at[2] = {0, 29};
        stats = STRATA_LOAD_STATS_INIT;
        ASSERT_STRATA_OK(strata_engine_load_safetensors_at(e, ck, pu, pp, pt, at, 2, nullptr, &stats));
        EXPECT_EQ(stats.bytes_read, 4 * (held(0, 8) + held(29, 3))) << "stage " << stage;
        ASSERT_STRATA_OK(strata_engine_gather_param(e, 0, 0, got, 32));
        for (int k = 0; k < 32; ++k) {
          uint32_t bits = static_cast<uint32_t>(w[k]) << 16;
          float want;
          std::memcpy(&want, &bits, 4);
          if (k < 8) want = b[k];
          if (k >= 29) want = x[k - 29];
          EXPECT_EQ(got[k], want) << "stage " << stage << " element " << k;
        }
        const uint64_t past[1] = {30};
        EXPECT_STRATA_ERROR(strata_engine_load_safetensors_at(e, ck, pu, pp, pt + 1, past, 1, nullptr, nullptr),
                            kInvalid, "tensor 'x' has 3 elements; parameter 'a.w' has 32 (the tensor's elements go "
                            "from element 30)");
        EXPECT_STRATA_ERROR(strata_engine_load_safetensors_at(e, ck, pu, pp, pt, nullptr, 1, nullptr, nullptr),
                            kInvalid, "at is NULL");
      }

      const uint64_t x_for_w = 3, int_for_b = 1, none = 99;
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, units, params, &x_for_w, 1, nullptr, nullptr), kInvalid,
                          "tensor 'x' has 3 elements; parameter 'a.w' has 32");
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, units, params + 1, &int_for_b, 1, nullptr, nullptr),
                          kInvalid, "tensor 'i' is I32; a parameter is read from F32, BF16 or F16");
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, units, params, &none, 1, nullptr, nullptr), kRange,
                          "tensors[0] is 99; the checkpoint has 4");
      const int32_t bad_unit = 7;
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, &bad_unit, params, tensors, 1, nullptr, nullptr),
                          kRange, "no unit 7");
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, nullptr, params, tensors, 1, nullptr, nullptr),
                          kInvalid, "units is NULL");
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, nullptr, units, params, tensors, 1, nullptr, nullptr),
                          kInvalid, "checkpoint is NULL");
      strata_load_options o = STRATA_LOAD_OPTIONS_INIT;
      o.io_backend = 7;
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, units, params, tensors, 1, &o, nullptr), kInvalid,
                          "options.io_backend is 7");
      o = STRATA_LOAD_OPTIONS_INIT;
      o.struct_size = 4;
      EXPECT_STRATA_ERROR(strata_engine_load_safetensors(e, ck, units, params, tensors, 1, &o, nullptr),
                          STRATA_ERR_VERSION, "options");
      o = STRATA_LOAD_OPTIONS_INIT;
      o.io_backend = 2;  // the thread pool, asked for
      stats = STRATA_LOAD_STATS_INIT;
      ASSERT_STRATA_OK(strata_engine_load_safetensors(e, ck, units, params, tensors, 2, &o, &stats));
      EXPECT_EQ(std::string(stats.backend).rfind("threads", 0), 0u) << stats.backend;
      char raw[8];
      EXPECT_STRATA_ERROR(strata_safetensors_read(ck, 1, 28, raw, 8), kRange, "tensor 'i' has 32 bytes");
      ASSERT_STRATA_OK(strata_safetensors_read(ck, 0, 4, raw, 4));
      EXPECT_EQ(std::memcmp(raw, &b[1], 4), 0);
      EXPECT_STRATA_ERROR(strata_safetensors_tensor_info(ck, 4, &t), kRange, "tensor 4 of 4");
      EXPECT_STRATA_ERROR(strata_safetensors_open(nullptr, &ck), kInvalid, "path is NULL");
      strata_safetensors* missing = nullptr;
      EXPECT_STRATA_ERROR(strata_safetensors_open("/nonexistent/w.safetensors", &missing), STRATA_ERR_NOT_FOUND,
                          "'/nonexistent/w.safetensors': No such file");
      EXPECT_EQ(missing, nullptr);
      EXPECT_STRATA_OK(strata_safetensors_close(nullptr));
      EXPECT_STRATA_OK(strata_safetensors_close(ck));
      EXPECT_STRATA_OK(strata_engine_destroy(e));
      std::remove(path.c_str());
    });
  }
}

TEST(CApiErrors, CallsOutOfOrderAreFailedPrecondition) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, true, &e));
    void* p = nullptr;
    float* g = nullptr;
    float buf[8] = {};
    const strata_param_spec s = Spec("w", kShapeAB, 1, 0, STRATA_INIT_ZEROS, 0);
    EXPECT_STRATA_ERROR(strata_engine_register_unit(e, "late", &s, 1, nullptr), kOrder, "after Finalize");
    EXPECT_STRATA_ERROR(strata_engine_finalize(e), kOrder, "called twice");
    EXPECT_STRATA_ERROR(strata_engine_end_forward(e, 0), kOrder, "no open forward use");
    EXPECT_STRATA_ERROR(strata_engine_param(e, 0, 0, &p), kOrder, "not between a begin and its end");
    EXPECT_STRATA_ERROR(strata_engine_begin_backward(e, 0, nullptr), kOrder, "outside a micro-batch");
    EXPECT_STRATA_ERROR(strata_engine_end_micro_batch(e), kOrder, "without BeginMicroBatch");
    EXPECT_STRATA_ERROR(strata_engine_step(e, nullptr), kOrder, "after 0 micro-batches");
    EXPECT_STRATA_OK(strata_engine_zero_grad(e));  // nothing accumulated yet
    ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
    EXPECT_STRATA_ERROR(strata_engine_begin_micro_batch(e), kOrder, "inside an open micro-batch");
    EXPECT_STRATA_ERROR(strata_engine_step(e, nullptr), kOrder, "inside an open micro-batch");
    EXPECT_STRATA_ERROR(strata_engine_zero_grad(e), kOrder, "cannot be discarded");
    EXPECT_STRATA_ERROR(strata_engine_set_param(e, 0, 1, buf, 8), kOrder, "between steps");
    ASSERT_STRATA_OK(strata_engine_begin_forward(e, 0, nullptr));
    EXPECT_STRATA_OK(strata_engine_param(e, 0, 0, &p));
    EXPECT_NE(p, nullptr);
    EXPECT_STRATA_ERROR(strata_engine_grad(e, 0, 0, &g), kOrder, "gradients exist only there");
    EXPECT_STRATA_ERROR(strata_engine_end_backward(e, 0), kOrder, "no open backward use");
    ASSERT_STRATA_OK(strata_engine_end_forward(e, 0));
    EXPECT_STRATA_ERROR(strata_engine_param(e, 0, 0, &p), kOrder, "not between a begin and its end");
    EXPECT_EQ(p, nullptr);
    EXPECT_STRATA_ERROR(strata_engine_begin_backward(e, 1, nullptr), kOrder, "only 0 forward uses");
    ASSERT_STRATA_OK(strata_engine_begin_backward(e, 0, nullptr));
    EXPECT_STRATA_OK(strata_engine_grad(e, 0, 1, &g));
    EXPECT_NE(g, nullptr);
    ASSERT_STRATA_OK(strata_engine_end_backward(e, 0));
    ASSERT_STRATA_OK(strata_engine_end_micro_batch(e));
    EXPECT_STRATA_ERROR(strata_engine_zero_grad(e), kOrder, "1 micro-batch(es)");
    EXPECT_STRATA_ERROR(strata_engine_save_checkpoint(e, "/tmp/x", nullptr), kOrder, "between steps");
    EXPECT_STRATA_ERROR(strata_comm_destroy(comm), kOrder, "still alive");
    ASSERT_STRATA_OK(strata_engine_step(e, nullptr));
    EXPECT_STRATA_OK(strata_engine_zero_grad(e));
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, AFailedHookPoisonsTheEngineWithItsCause) {
  RunCRanks(1, [](int, strata_comm* comm) {
    strata_engine* e = nullptr;
    ASSERT_STRATA_OK(MakeEngine(comm, nullptr, true, &e));
    ASSERT_STRATA_OK(strata_engine_begin_micro_batch(e));
    ASSERT_STRATA_OK(strata_engine_begin_forward(e, 0, nullptr));
    EXPECT_STRATA_ERROR(strata_engine_end_micro_batch(e), kOrder, "unit 'a' was begun but not ended");
    EXPECT_STRATA_ERROR(strata_engine_end_forward(e, 0), kOrder, "after an earlier failure: EndMicroBatch()");
    EXPECT_STRATA_OK(strata_engine_destroy(e));
  });
}

TEST(CApiErrors, LastErrorIsPerThreadStableAndClearedOnSuccess) {
  const char* before = strata_last_error();
  EXPECT_STRATA_ERROR(strata_engine_finalize(nullptr), kInvalid, "engine is NULL");
  EXPECT_EQ(strata_last_error(), before) << "the pointer stays the same: read early, it shows the latest";
  std::string other;
  std::thread([&] { other = strata_last_error(); }).join();
  EXPECT_EQ(other, "") << "another thread's error leaked";
  EXPECT_NE(std::string(strata_last_error()), "");
  EXPECT_STRATA_OK(strata_engine_destroy(nullptr));
  EXPECT_STREQ(strata_last_error(), "");
}

}  // namespace
}  // namespace strata::capi_test
