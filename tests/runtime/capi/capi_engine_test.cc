// Tests for ValidateUnitSpecs (runtime/capi/capi_engine.cc), the C ABI's spec validation as a pure function
// with no engine: the fuzzers' entry point. Valid specs pass and come back as the engine would register
// them; every hostile field (NULLs, ndim, init kinds, struct sizes, extents whose product overflows, a
// name twice, a bad world size) is an error, never a crash.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/capi/capi_internal.h"

namespace strata::capi {
namespace {

using ::testing::HasSubstr;

strata_param_spec Spec(const char* name, const int64_t* shape, int32_t ndim, int32_t init = STRATA_INIT_ZEROS) {
  strata_param_spec s = STRATA_PARAM_SPEC_INIT;
  s.name = name;
  s.shape = shape;
  s.ndim = ndim;
  s.init = init;
  return s;
}

void ExpectInvalid(const char* name, const strata_param_spec* specs, int32_t n, int world, const std::string& what) {
  auto r = ValidateUnitSpecs(name, specs, n, world);
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(what));
}

TEST(ValidateUnitSpecs, ValidSpecsPass) {
  const int64_t w[] = {4, 3}, b[] = {4};
  const strata_param_spec specs[2] = {Spec("w", w, 2, STRATA_INIT_NORMAL), Spec("b", b, 1)};
  auto r = ValidateUnitSpecs("layer", specs, 2, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].name, "w");
  EXPECT_EQ((*r)[0].shape, std::vector<int64_t>({4, 3}));
}

TEST(ValidateUnitSpecs, HostileSpecsAreErrors) {
  const int64_t ok[] = {8}, zero[] = {0}, negative[] = {-1};
  const int64_t wraps[] = {int64_t{1} << 32, int64_t{1} << 32, 4};  // 2^66: wrapped to 0 before the checked product
  const int64_t max[] = {INT64_MAX, INT64_MAX};
  strata_param_spec s = Spec("w", ok, 1);
  ExpectInvalid(nullptr, &s, 1, 1, "name is NULL");
  ExpectInvalid("u", nullptr, 1, 1, "params is NULL");
  ExpectInvalid("u", &s, 0, 1, "num_params is 0");
  ExpectInvalid("u", &s, INT32_MIN, 1, "num_params is -2147483648");
  ExpectInvalid("", &s, 1, 1, "non-empty name");
  ExpectInvalid("u", &s, 1, 0, "world size 0");
  ExpectInvalid("u", &s, 1, INT_MAX, "world size 2147483647");
  s = Spec("w", wraps, 3);
  ExpectInvalid("u", &s, 1, 1, "exceeds 2^48 elements");
  s = Spec("w", max, 2);
  ExpectInvalid("u", &s, 1, 1, "exceeds 2^48 elements");
  s = Spec("w", zero, 1);
  ExpectInvalid("u", &s, 1, 1, "has dimension 0");
  s = Spec("w", negative, 1);
  ExpectInvalid("u", &s, 1, 1, "has dimension -1");
  s = Spec("w", ok, INT32_MIN);
  ExpectInvalid("u", &s, 1, 1, "ndim is -2147483648");
  s = Spec("w", ok, 1, INT32_MIN);
  ExpectInvalid("u", &s, 1, 1, "init is -2147483648");
  s = Spec("w", ok, 1);
  s.struct_size = 3;
  ExpectInvalid("u", &s, 1, 1, "struct_size");
  s = Spec("", ok, 1);
  ExpectInvalid("u", &s, 1, 1, "no name");
  const strata_param_spec twice[2] = {Spec("w", ok, 1), Spec("w", ok, 1)};
  ExpectInvalid("u", twice, 2, 1, "registers parameter 'w' twice");
  // Many parameters that fit alone but not together.
  const int64_t big[] = {int64_t{1} << 47};
  const strata_param_spec three[3] = {Spec("a", big, 1), Spec("b", big, 1), Spec("c", big, 1)};
  ExpectInvalid("u", three, 3, 1, "the sum of its 3 parameters exceeds 2^48");
}

// strata_param_spec.frozen was appended to the struct: a caller built before it passes the smaller
// struct_size, and its parameters are trainable whatever lies beyond that size.
TEST(ValidateUnitSpecs, FrozenIsReadFromCallersThatKnowItAndFalseForOlderOnes) {
  const int64_t w[] = {4};
  strata_param_spec specs[2] = {Spec("w", w, 1), Spec("b", w, 1)};
  specs[0].frozen = specs[1].frozen = 1;
  auto r = ValidateUnitSpecs("base", specs, 2, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)[0].frozen);
  EXPECT_TRUE((*r)[1].frozen);
  specs[1].frozen = 0;
  r = ValidateUnitSpecs("base", specs, 2, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)[1].frozen);
  // The version-1 layout ends at init_value; the bytes after it (here frozen = 1) are not the caller's.
  const uint32_t v1 = offsetof(strata_param_spec, init_value) + sizeof(float);
  ASSERT_EQ(v1, offsetof(strata_param_spec, frozen));
  strata_param_spec old[2] = {Spec("w", w, 1), Spec("b", w, 1)};
  old[0].frozen = old[1].frozen = 1;
  old[0].struct_size = v1;  // the stride: the old struct's elements are packed at v1 bytes
  std::vector<char> packed(2 * v1);
  std::memcpy(packed.data(), &old[0], v1);
  std::memcpy(packed.data() + v1, &old[1], v1);
  reinterpret_cast<strata_param_spec*>(packed.data() + v1)->struct_size = v1;
  r = ValidateUnitSpecs("base", reinterpret_cast<const strata_param_spec*>(packed.data()), 1, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)[0].frozen) << "read past an old caller's struct";
  // The reserved field must stay zero (a later library may give it a meaning).
  strata_param_spec reserved = Spec("w", w, 1);
  reserved.reserved = 7;
  ExpectInvalid("base", &reserved, 1, 1, "params[0].reserved is 7; it must be 0");
  // The struct has no padding an older library would scan as unknown bytes.
  EXPECT_EQ(sizeof(strata_param_spec), offsetof(strata_param_spec, own_weight_decay) + sizeof(double));
  EXPECT_EQ(offsetof(strata_param_spec, has_own_lr), offsetof(strata_param_spec, reserved) + sizeof(int32_t));
}

// The own lr and weight decay (Note [Param groups]) were appended: read from a caller that knows them, each when
// its has_ flag is set; a caller built before them (struct_size ending at `reserved`) gets the config's values
// whatever lies beyond; bad values are named.
TEST(ValidateUnitSpecs, OwnLrAndWeightDecayAreReadWhenFlaggedAndAbsentForOlderCallers) {
  const int64_t w[] = {4};
  strata_param_spec specs[2] = {Spec("w", w, 1), Spec("b", w, 1)};
  specs[0].weight_decay = 1;
  specs[0].has_own_lr = specs[0].has_own_weight_decay = 1;
  specs[0].own_lr = 0.03;
  specs[0].own_weight_decay = 0.25;
  specs[1].own_lr = 0.5;  // without its flag: not read
  auto r = ValidateUnitSpecs("u", specs, 2, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].own_lr, 0.03);
  EXPECT_EQ((*r)[0].own_weight_decay, 0.25);
  EXPECT_FALSE((*r)[1].own_lr.has_value());
  EXPECT_FALSE((*r)[1].own_weight_decay.has_value());
  const uint32_t before = offsetof(strata_param_spec, reserved) + sizeof(int32_t);
  strata_param_spec old = specs[0];
  old.struct_size = before;
  r = ValidateUnitSpecs("u", &old, 1, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)[0].own_lr.has_value()) << "read past an old caller's struct";
  EXPECT_FALSE((*r)[0].own_weight_decay.has_value());
  strata_param_spec bad = specs[0];
  bad.own_lr = -1;
  ExpectInvalid("u", &bad, 1, 1, "parameter 'u.w' has its own lr -1; it must be finite and >= 0");
  bad = specs[1];
  bad.has_own_weight_decay = 1;
  bad.own_weight_decay = 0.1;
  ExpectInvalid("u", &bad, 1, 1, "parameter 'u.b' has its own weight decay 0.1 but its weight-decay flag is off");
}

}  // namespace
}  // namespace strata::capi

namespace strata::capi {
namespace {

// Host memory that runs out inside a call is STRATA_ERR_RESOURCE_EXHAUSTED naming it (issue 33: it was
// STRATA_ERR_INTERNAL "unexpected C++ exception"), so a caller can tell it from a bug and lower its batch.
TEST(CallWrapper, OutOfHostMemoryIsResourceExhausted) {
  const strata_status s = Call("strata_engine_step", []() -> absl::Status { throw std::bad_alloc(); });
  EXPECT_EQ(s, STRATA_ERR_RESOURCE_EXHAUSTED);
  EXPECT_THAT(strata_last_error(), ::testing::AllOf(::testing::HasSubstr("strata_engine_step"),
                                                    ::testing::HasSubstr("out of host memory")));
  EXPECT_EQ(Call("strata_engine_step", []() -> absl::Status { throw std::runtime_error("x"); }), STRATA_ERR_INTERNAL);
}

}  // namespace
}  // namespace strata::capi
