// DecideRoundClose (coordinator/round_policy.h): the decision and the reason, for each way a round can stand.
#include "coordinator/round_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RoundPolicyOptions Options(int64_t min_workers, double timeout_s) {
  RoundPolicyOptions o;
  o.min_workers = min_workers;
  o.round_timeout_s = timeout_s;
  return o;
}

TEST(RoundPolicyTest, ClosesWhenEveryActiveMemberPushed) {
  RoundView round{{"w0", "w1", "w2"}, {"w0", "w1", "w2"}, 100.0};
  RoundDecision d = DecideRoundClose(round, 101.0, Options(2, 60));
  EXPECT_TRUE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("all 3 active members pushed"));
}

TEST(RoundPolicyTest, ClosesWhenActiveSetShrankBelowPushes) {
  // w1 pushed, then was marked lost: its push still counts, and nobody active is missing.
  RoundView round{{"w0"}, {"w0", "w1"}, 0.0};
  RoundDecision d = DecideRoundClose(round, 1.0, Options(2, 60));
  EXPECT_TRUE(d.close);
}

TEST(RoundPolicyTest, WaitsBelowMinWorkersEvenWhenAllActivePushed) {
  RoundView round{{"w0"}, {"w0"}, 0.0};
  RoundDecision d = DecideRoundClose(round, 1.0, Options(2, 60));
  EXPECT_FALSE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("min_workers"));
  EXPECT_THAT(d.reason, HasSubstr("1 of min_workers 2"));
}

TEST(RoundPolicyTest, WaitsBelowMinWorkersEvenPastTheTimeout) {
  RoundView round{{"w0", "w1", "w2"}, {"w0"}, 0.0};
  RoundDecision d = DecideRoundClose(round, 1000.0, Options(2, 60));
  EXPECT_FALSE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("min_workers"));
}

TEST(RoundPolicyTest, TimeoutWithEnoughPushesClosesAndNamesTheMissing) {
  RoundView round{{"w0", "w1", "w2"}, {"w0", "w2"}, 10.0};
  RoundDecision d = DecideRoundClose(round, 70.0, Options(2, 60));  // age exactly the timeout
  EXPECT_TRUE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("w1"));
  EXPECT_THAT(d.reason, Not(HasSubstr("w0")));
  EXPECT_THAT(d.reason, HasSubstr("round_timeout_s"));
}

TEST(RoundPolicyTest, BeforeTimeoutWaitsAndNamesTheMissing) {
  RoundView round{{"w0", "w1", "w2"}, {"w0"}, 10.0};
  RoundDecision d = DecideRoundClose(round, 40.0, Options(1, 60));
  EXPECT_FALSE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("w1, w2"));
  EXPECT_THAT(d.reason, HasSubstr("timeout in 30 s"));
}

TEST(RoundPolicyTest, DecisionDependsOnInjectedClockOnly) {
  RoundView round{{"a", "b"}, {"a"}, 5.0};
  EXPECT_FALSE(DecideRoundClose(round, 5.0 + 59.999, Options(1, 60)).close);
  EXPECT_TRUE(DecideRoundClose(round, 5.0 + 60.0, Options(1, 60)).close);
  EXPECT_FALSE(DecideRoundClose(round, 5.0 + 59.999, Options(1, 60)).close) << "pure: same inputs, same answer";
}

}  // namespace
}  // namespace diloco
