// The round's pure rules (coordinator/round_policy.h): DecideRoundClose, DecideAsyncClose, HoldForPartialPushes and
// DecidePushRound, the decision and the reason, for each way a round can stand.
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
  EXPECT_THAT(d.reason, Not(HasSubstr("until a worker joins"))) << "w1 and w2 may still push";
}

// One active member left of min_workers 2 (the other left or was lost): past round_timeout_s the reason says the
// round cannot close until a worker joins, so the log says it once more than "waiting for pushes" (which it said
// when the round opened, and then nothing for as long as the run stalled).
TEST(RoundPolicyTest, PastTheTimeoutWithTooFewMembersTheReasonSaysAWorkerMustJoin) {
  RoundView round{{"w0"}, {"w0"}, 0.0};
  EXPECT_EQ(DecideRoundClose(round, 59.0, Options(2, 60)).reason,
            "waiting for pushes: 1 of min_workers 2 received (1 active)");
  const RoundDecision d = DecideRoundClose(round, 60.0, Options(2, 60));
  EXPECT_FALSE(d.close);
  EXPECT_EQ(d.reason,
            "waiting for pushes: 1 of min_workers 2 received (1 active); round_timeout_s passed and fewer members than "
            "min_workers can push: the round waits until a worker joins (diloco-worker --coordinator ... --id ...)");
}

// Active members quarantined for the round may not push before it closes: past round_timeout_s they are excused
// from min_workers (else min_workers = every member would wait forever), never below one push; before it, the round
// waits for min_workers (a member still joining may come).
TEST(RoundPolicyTest, QuarantinedMembersAreExcusedFromMinWorkersPastTheTimeout) {
  RoundView round{{"w0", "w1"}, {"w0", "w1"}, 0.0, /*quarantined=*/1};
  EXPECT_FALSE(DecideRoundClose(round, 59.0, Options(3, 60)).close);
  EXPECT_TRUE(DecideRoundClose(round, 60.0, Options(3, 60)).close);
  round.quarantined = 0;
  EXPECT_FALSE(DecideRoundClose(round, 60.0, Options(3, 60)).close);
  RoundView one{{"w0", "w1"}, {"w0"}, 0.0, /*quarantined=*/1};
  const RoundDecision d = DecideRoundClose(one, 60.0, Options(3, 60));
  EXPECT_FALSE(d.close);
  EXPECT_THAT(d.reason, HasSubstr("1 of min_workers 3 less 1 quarantined received"));
  // Three active members besides the quarantined one: min_workers 3 can be reached, nobody is excused.
  RoundView others{{"w0", "w1", "w2"}, {"w0", "w1"}, 0.0, /*quarantined=*/1};
  EXPECT_FALSE(DecideRoundClose(others, 60.0, Options(3, 60)).close);
  EXPECT_EQ(PushesNeeded(3, 1, 2), 2);
  EXPECT_EQ(PushesNeeded(3, 1, 3), 3);
  EXPECT_EQ(PushesNeeded(3, 5, 0), 1);
  EXPECT_EQ(PushesNeeded(3, 2, 2), 2) << "both members that may push must";
  RoundView late{{"w0", "w1"}, {"w0"}, 0.0, /*quarantined=*/2};  // w1 may push: the round waits for it
  EXPECT_FALSE(DecideRoundClose(late, 600.0, Options(3, 60)).close);
  EXPECT_EQ(PushesNeeded(3, 1, 1), 2) << "one member short beyond the quarantined: a member may join";
  EXPECT_EQ(PushesNeeded(1, 0, 0), 1);
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

// outer.mode async: a version closes once a push has committed and no stream is open.
TEST(AsyncRoundPolicyTest, WaitsForAPushThenForOpenStreamsThenCloses) {
  RoundDecision none = DecideAsyncClose({0, 0});
  EXPECT_FALSE(none.close);
  EXPECT_EQ(none.reason, "async: waiting for a push");
  RoundDecision streaming_only = DecideAsyncClose({0, 2});
  EXPECT_FALSE(streaming_only.close);
  EXPECT_EQ(streaming_only.reason, "async: waiting for a push");
  RoundDecision streaming = DecideAsyncClose({1, 2});
  EXPECT_FALSE(streaming.close);
  EXPECT_EQ(streaming.reason, "async: waiting for 2 push stream(s)");
  RoundDecision arrived = DecideAsyncClose({3, 0});
  EXPECT_TRUE(arrived.close);
  EXPECT_EQ(arrived.reason, "async: 3 push(es) arrived");
}

TEST(HoldForPartialPushesTest, TurnsACloseIntoAWaitOnlyWhilePushesArePartFolded) {
  const RoundDecision close{true, "all 2 active members pushed"};
  RoundDecision held = HoldForPartialPushes(close, 1);
  EXPECT_FALSE(held.close);
  EXPECT_EQ(held.reason, "ready to close; waiting for 1 push stream(s) in flight");
  RoundDecision free = HoldForPartialPushes(close, 0);
  EXPECT_TRUE(free.close);
  EXPECT_EQ(free.reason, close.reason);
  const RoundDecision wait{false, "waiting for w1 (1 pushed, timeout in 5 s)"};
  RoundDecision still = HoldForPartialPushes(wait, 3);
  EXPECT_FALSE(still.close);
  EXPECT_EQ(still.reason, wait.reason);  // the reason it waits is not hidden by the partial pushes
}

TEST(PushRoundPolicyTest, SyncAcceptsOnlyTheOpenRoundWhileTraining) {
  const PushRoundOptions sync{false, 16};
  EXPECT_TRUE(DecidePushRound({3, 3, RoundPhase::kTraining}, sync).ok());
  absl::Status late = DecidePushRound({3, 2, RoundPhase::kTraining}, sync);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(late.message(),
            "push for round 3 refused: the coordinator's round is 4 (phase training); pull the current "
            "parameters");
  EXPECT_EQ(DecidePushRound({3, 4, RoundPhase::kTraining}, sync).code(), absl::StatusCode::kFailedPrecondition);
  absl::Status stepping = DecidePushRound({3, 3, RoundPhase::kStepping}, sync);
  EXPECT_EQ(stepping.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stepping.message()), HasSubstr("(phase stepping)"));
  EXPECT_THAT(std::string(DecidePushRound({3, 3, RoundPhase::kFinishing}, sync).message()),
              HasSubstr("(phase finishing)"));
}

TEST(PushRoundPolicyTest, AsyncAcceptsUpToMaxStalenessAndAsksToRetryWhileStepping) {
  const PushRoundOptions async{true, 2};
  EXPECT_TRUE(DecidePushRound({5, 5, RoundPhase::kTraining}, async).ok());
  EXPECT_TRUE(DecidePushRound({5, 3, RoundPhase::kTraining}, async).ok());  // exactly max_staleness behind
  absl::Status stale = DecidePushRound({5, 2, RoundPhase::kTraining}, async);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.message(),
            "push computed against version 2 refused: the global model is at version 5 (3 behind; "
            "outer.max_staleness is 2); pull the current parameters");
  absl::Status future = DecidePushRound({5, 6, RoundPhase::kTraining}, async);
  EXPECT_EQ(future.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(future.message()), HasSubstr("(-1 behind"));
  absl::Status stepping = DecidePushRound({5, 5, RoundPhase::kStepping}, async);
  EXPECT_EQ(stepping.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stepping.message(), "the global model is being stepped to version 6; retry");
  // The last version is stepped (its evaluation, checkpoint and summary are being written): nothing to retry for.
  // Before, the workers were told to retry until the run completed.
  for (const RoundPhase phase : {RoundPhase::kFinishing, RoundPhase::kComplete}) {
    absl::Status ending = DecidePushRound({5, 5, phase}, async);
    EXPECT_EQ(ending.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ending.message(), "the run's last version (5) is stepped; the run is ending");
  }
}

TEST(QuarantineTest, AFirstBreakIsForgivenThenTheQuarantineDoublesUpToItsBound) {
  EXPECT_EQ(QuarantineRounds(0, false), 0);
  EXPECT_EQ(QuarantineRounds(1, false), 0) << "one broken push: a network blip, the worker pushes again";
  EXPECT_EQ(QuarantineRounds(2, false), 1);
  EXPECT_EQ(QuarantineRounds(3, false), 2);
  EXPECT_EQ(QuarantineRounds(4, false), 4);
  EXPECT_EQ(QuarantineRounds(6, false), 16);
  EXPECT_EQ(QuarantineRounds(100, false), kMaxQuarantineRounds);
  EXPECT_EQ(QuarantineRounds(1, true), 1) << "a stall held a due close: quarantined at once";
  EXPECT_EQ(QuarantineRounds(2, true), 2);
  EXPECT_EQ(QuarantineRounds(50, true), kMaxQuarantineRounds);
}

// The mode's rules, chosen by the policy (the core never branches on outer.mode).
TEST(RoundPolicyTest, TheModeChoosesTheCloseRule) {
  // Both pushed of two active members, one more push streaming.
  const CloseView view{{{"w0", "w1"}, {"w0", "w1"}, 0.0}, {2, 1}};
  const RoundDecision sync = DecideCloseOf(OuterMode::kSync, view, 1.0, Options(1, 60));
  EXPECT_TRUE(sync.close);
  EXPECT_THAT(sync.reason, HasSubstr("all 2 active members pushed"));
  const RoundDecision async = DecideCloseOf(OuterMode::kAsync, view, 1.0, Options(1, 60));
  EXPECT_FALSE(async.close);
  EXPECT_EQ(async.reason, "async: waiting for 1 push stream(s)");
}

TEST(RoundPolicyTest, TheModeChoosesWhenStreamsHoldAClose) {
  const CloseView streaming{{{"w0"}, {"w0"}, 0.0}, {1, 1}};
  const RoundDecision due{true, "due"}, waiting{false, "waiting"};
  EXPECT_TRUE(StreamsHoldClose(OuterMode::kSync, due, streaming, 1)) << "a due close with a part-folded push";
  EXPECT_FALSE(StreamsHoldClose(OuterMode::kSync, due, streaming, 0)) << "streams that folded nothing never hold";
  EXPECT_FALSE(StreamsHoldClose(OuterMode::kSync, waiting, streaming, 1)) << "nothing is due";
  EXPECT_TRUE(StreamsHoldClose(OuterMode::kAsync, waiting, streaming, 0)) << "async: arrivals wait for streams";
  const CloseView no_arrivals{{{"w0"}, {}, 0.0}, {0, 1}};
  EXPECT_FALSE(StreamsHoldClose(OuterMode::kAsync, waiting, no_arrivals, 1));
  EXPECT_TRUE(LogsWaitReasons(OuterMode::kSync));
  EXPECT_FALSE(LogsWaitReasons(OuterMode::kAsync));
}

TEST(RoundPolicyTest, PushRoundOptionsFollowTheMode) {
  Config config;
  config.outer.max_staleness = 3;
  EXPECT_FALSE(PushRoundOptionsOf(config).async);
  config.outer.mode = OuterMode::kAsync;
  const PushRoundOptions options = PushRoundOptionsOf(config);
  EXPECT_TRUE(options.async);
  EXPECT_EQ(options.max_staleness, 3);
  EXPECT_TRUE(DecidePushRound({5, 2, RoundPhase::kTraining}, options).ok()) << "3 behind, within max_staleness";
}

}  // namespace
}  // namespace diloco
