// Note [Unit protocol] (runtime/engine/unit_owners.h): one unit's transitions, without an engine. Each
// refusal names the hook and the unit and leaves the counts as they were; the engine's own tests
// (engine_test, engine_errors_test, capi_errors_test) check the same messages through the hooks.
#include <string>

#include "gtest/gtest.h"
#include "runtime/engine/unit_owners.h"

namespace strata::engine {
namespace {

void ExpectRefused(const absl::Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(std::string(s.message()), message);
}

TEST(UnitProtocol, AForwardAndItsBackwardCompleteTheUnit) {
  UnitProtocol p;
  EXPECT_TRUE(p.idle());
  ASSERT_TRUE(p.CheckPreForward("u").ok());
  p.CountForward();
  p.BeginCompute(10);
  EXPECT_FALSE(p.idle());
  EXPECT_FALSE(p.last_backward_use());
  ASSERT_EQ(*p.PostForward("u"), 10);  // when the compute began
  EXPECT_TRUE(p.idle());
  ASSERT_TRUE(p.CheckPreBackward("u").ok());
  p.CountBackward();
  p.BeginCompute(20);
  EXPECT_TRUE(p.used_in_backward());
  ASSERT_EQ(*p.PostBackward("u"), 20);
  EXPECT_TRUE(p.last_backward_use());
  EXPECT_TRUE(p.CheckMicroBatchEnd("u").ok());
  p.BeginMicroBatch();
  EXPECT_FALSE(p.used_in_backward());
}

TEST(UnitProtocol, TwoForwardUsesNeedTwoBackwardUses) {
  UnitProtocol p;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(p.CheckPreForward("u").ok());
    p.CountForward();
  }
  p.CountBackward();
  EXPECT_FALSE(p.last_backward_use());
  ExpectRefused(p.CheckMicroBatchEnd("u"),
                "EndMicroBatch(): unit 'u' had 2 forward but 1 backward uses; every forward use needs its backward");
  ASSERT_TRUE(p.CheckPreBackward("u").ok());
  p.CountBackward();
  EXPECT_TRUE(p.last_backward_use());
  ExpectRefused(p.CheckPreBackward("u"),
                "BeginBackward('u'): 3 backward uses but only 2 forward uses in this "
                "micro-batch");
  EXPECT_TRUE(p.CheckMicroBatchEnd("u").ok());
}

TEST(UnitProtocol, RefusalsNameTheHookAndTheUnit) {
  UnitProtocol p;
  ExpectRefused(p.PostForward("u").status(), "EndForward('u') without BeginForward");
  ExpectRefused(p.PostBackward("u").status(), "EndBackward('u') without BeginBackward");
  ExpectRefused(p.CheckPreBackward("u"),
                "BeginBackward('u'): 1 backward uses but only 0 forward uses in this "
                "micro-batch");
  p.CountForward();
  p.CountBackward();
  ExpectRefused(p.CheckPreForward("u"), "BeginForward('u') after its backward began in this micro-batch");
  p.BeginCompute(0);
  ExpectRefused(p.CheckMicroBatchEnd("u"), "EndMicroBatch(): unit 'u' was begun but not ended");
  EXPECT_TRUE(p.PostBackward("u").ok());
  EXPECT_TRUE(p.idle());
  EXPECT_TRUE(p.CheckMicroBatchEnd("u").ok());
}

}  // namespace
}  // namespace strata::engine
