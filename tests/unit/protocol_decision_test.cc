// The worker's decisions on each gRPC status (worker/protocol_decision.h): every code of docs/operations.md "Errors a
// push can
// get", and the Join / Pull / Heartbeat codes the loop handles; action, exit code and reason.
#include "worker/protocol_decision.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/worker_options.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;

ProtocolState State() {
  ProtocolState s;
  s.coordinator = "10.0.0.1:7777";
  s.worker_id = "w7";
  s.connect_timeout_s = 30;
  return s;
}

ProtocolDecision Push(const absl::Status& status, LatePolicy policy = LatePolicy::kDrop) {
  ProtocolState s = State();
  s.late_policy = policy;
  return DecideOnStatus(ProtocolCall::kPush, status, s);
}

// Each row of docs/operations.md "Errors a push can get": the code the coordinator sends and what the worker does.
TEST(ProtocolDecisionTest, PushErrorsTheCoordinatorDocuments) {
  struct Row {
    absl::Status status;
    ProtocolAction action;
    std::string reason;
  };
  const std::vector<Row> rows = {
      {absl::InvalidArgumentError("request without a worker id"), ProtocolAction::kGiveUp,
       "push refused: request without a worker id"},
      {absl::FailedPreconditionError("model fingerprint F does not match the coordinator's G"),
       ProtocolAction::kNextRound,
       "push not counted (model fingerprint F does not match the coordinator's G); restarting from the new global "
       "parameters"},
      {absl::NotFoundError("worker 'w7' is not an active member; Join again"), ProtocolAction::kRejoin,
       "not a member (worker 'w7' is not an active member; Join again); joining again to push again"},
      {absl::NotFoundError("worker 'w7' lease expired"), ProtocolAction::kRejoin,
       "not a member (worker 'w7' lease expired); joining again to push again"},
      {absl::FailedPreconditionError("the run is complete"), ProtocolAction::kNextRound,
       "push not counted (the run is complete); restarting from the new global parameters"},
      {absl::FailedPreconditionError("push for round 4 refused: the coordinator's round is 5"),
       ProtocolAction::kNextRound,
       "push not counted (push for round 4 refused: the coordinator's round is 5); restarting from the new "
       "global parameters"},
      {absl::AlreadyExistsError("worker 'w7' already pushed for round 4"), ProtocolAction::kCounted,
       "push already counted (worker 'w7' already pushed for round 4)"},
      {absl::UnavailableError("a push from worker 'w7' for round 4 is still streaming"), ProtocolAction::kRetry,
       "push failed (a push from worker 'w7' for round 4 is still streaming), retrying"},
      {absl::InvalidArgumentError("push header: tokens (0) must be in [1, 2^40]"), ProtocolAction::kGiveUp,
       "push refused: push header: tokens (0) must be in [1, 2^40]"},
      {absl::InvalidArgumentError("pseudo-gradient of 'wte' holds NaN or Inf near element 5; push refused"),
       ProtocolAction::kGiveUp, "push refused: pseudo-gradient of 'wte' holds NaN or Inf near element 5; push refused"},
      {absl::InvalidArgumentError("push stream ended early, at tensor 2/9 'x' at element 0"), ProtocolAction::kGiveUp,
       "push refused: push stream ended early, at tensor 2/9 'x' at element 0"},
      {absl::ResourceExhaustedError("Received message larger than max (9 vs. 4)"), ProtocolAction::kGiveUp,
       "push refused: Received message larger than max (9 vs. 4)"},
      {absl::AbortedError("the round's aggregation restarted"), ProtocolAction::kRepush,
       "push aborted (the round's aggregation restarted); pushing again"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.status.ToString());
    const ProtocolDecision d = Push(row.status);
    EXPECT_EQ(d.action, row.action);
    EXPECT_EQ(d.reason, row.reason);
    EXPECT_EQ(d.exit_code, row.action == ProtocolAction::kGiveUp ? kWorkerRefused : kWorkerDone);
    EXPECT_FALSE(d.keep_local);
  }
}

TEST(ProtocolDecisionTest, LatePushFollowsLatePolicy) {
  const absl::Status late = absl::FailedPreconditionError("push for round 4 refused: the coordinator's round is 5");
  const ProtocolDecision drop = Push(late, LatePolicy::kDrop);
  EXPECT_EQ(drop.action, ProtocolAction::kNextRound);
  EXPECT_FALSE(drop.keep_local);
  EXPECT_THAT(drop.reason, HasSubstr("restarting from the new global parameters"));
  const ProtocolDecision reuse = Push(late, LatePolicy::kReuseLocal);
  EXPECT_EQ(reuse.action, ProtocolAction::kNextRound);
  EXPECT_TRUE(reuse.keep_local);
  EXPECT_EQ(reuse.reason,
            "push not counted (push for round 4 refused: the coordinator's round is 5); "
            "continuing from local parameters (late_policy reuse_local)");
}

TEST(ProtocolDecisionTest, TransientCodesRetryEveryCall) {
  const std::vector<absl::Status> transient = {absl::UnavailableError("down"), absl::DeadlineExceededError("slow"),
                                               absl::CancelledError("cut"), absl::UnknownError("odd")};
  for (const absl::Status& s : transient) {
    SCOPED_TRACE(s.ToString());
    const std::string m(s.message());
    EXPECT_EQ(Push(s).action, ProtocolAction::kRetry);
    EXPECT_EQ(Push(s).reason, "push failed (" + m + "), retrying");
    const ProtocolDecision pull = DecideOnStatus(ProtocolCall::kPull, s, State());
    EXPECT_EQ(pull.action, ProtocolAction::kRetry);
    EXPECT_EQ(pull.reason, "pull failed (" + m + "), retrying");
    const ProtocolDecision beat = DecideOnStatus(ProtocolCall::kHeartbeat, s, State());
    EXPECT_EQ(beat.action, ProtocolAction::kRetry);
    EXPECT_EQ(beat.reason, "heartbeat failed (" + m + "), retrying");
    const ProtocolDecision join = DecideOnStatus(ProtocolCall::kJoin, s, State());
    EXPECT_EQ(join.action, ProtocolAction::kRetry);
    EXPECT_EQ(join.reason, "coordinator 10.0.0.1:7777 not reachable yet (" + m + "); retrying");
  }
}

TEST(ProtocolDecisionTest, SuccessProceeds) {
  for (ProtocolCall call : {ProtocolCall::kJoin, ProtocolCall::kPush, ProtocolCall::kPull, ProtocolCall::kHeartbeat}) {
    EXPECT_EQ(DecideOnStatus(call, absl::OkStatus(), State()).action, ProtocolAction::kProceed);
  }
  EXPECT_EQ(DecideOnStatus(ProtocolCall::kJoin, absl::OkStatus(), State()).reason, "joined");
  EXPECT_EQ(Push(absl::OkStatus()).reason, "pushed");
}

TEST(ProtocolDecisionTest, PullAndHeartbeatRejoinOnNotFound) {
  const absl::Status lost = absl::NotFoundError("worker 'w7' lease expired");
  const ProtocolDecision pull = DecideOnStatus(ProtocolCall::kPull, lost, State());
  EXPECT_EQ(pull.action, ProtocolAction::kRejoin);
  EXPECT_EQ(pull.reason, "not a member (worker 'w7' lease expired); joining again to pull again");
  const ProtocolDecision beat = DecideOnStatus(ProtocolCall::kHeartbeat, lost, State());
  EXPECT_EQ(beat.action, ProtocolAction::kRejoin);
  EXPECT_EQ(beat.reason, "not a member (worker 'w7' lease expired); joining again to push again");
}

// Codes only a push can act on stop a pull or a heartbeat, as does any other code.
TEST(ProtocolDecisionTest, PullAndHeartbeatGiveUpOnOtherCodes) {
  const std::vector<absl::Status> others = {
      absl::FailedPreconditionError("model fingerprint F does not match the coordinator's G"),
      absl::AlreadyExistsError("x"),
      absl::AbortedError("y"),
      absl::InvalidArgumentError("request without a worker id"),
      absl::PermissionDeniedError("wrong token"),
      absl::UnauthenticatedError("no token")};
  for (const absl::Status& s : others) {
    SCOPED_TRACE(s.ToString());
    const ProtocolDecision pull = DecideOnStatus(ProtocolCall::kPull, s, State());
    EXPECT_EQ(pull.action, ProtocolAction::kGiveUp);
    EXPECT_EQ(pull.exit_code, kWorkerRefused);
    EXPECT_EQ(pull.reason, "pull refused: " + std::string(s.message()));
    const ProtocolDecision beat = DecideOnStatus(ProtocolCall::kHeartbeat, s, State());
    EXPECT_EQ(beat.action, ProtocolAction::kGiveUp);
    EXPECT_EQ(beat.exit_code, kWorkerRefused);
    EXPECT_EQ(beat.reason, "heartbeat refused: " + std::string(s.message()));
  }
}

TEST(ProtocolDecisionTest, JoinRefusalNamesCoordinatorAndWorker) {
  for (const absl::Status& s : {absl::PermissionDeniedError("wrong token"), absl::NotFoundError("nope"),
                                absl::FailedPreconditionError("model fingerprint F does not match the coordinator's G"),
                                absl::AbortedError("z")}) {
    SCOPED_TRACE(s.ToString());
    const ProtocolDecision d = DecideOnStatus(ProtocolCall::kJoin, s, State());
    EXPECT_EQ(d.action, ProtocolAction::kGiveUp);
    EXPECT_EQ(d.exit_code, kWorkerRefused);
    EXPECT_EQ(d.reason, "coordinator 10.0.0.1:7777 refused worker w7: " + std::string(s.message()));
  }
}

TEST(ProtocolDecisionTest, JoinGivesUpAfterConnectTimeout) {
  ProtocolState s = State();
  s.connect_deadline_passed = true;
  const ProtocolDecision d = DecideOnStatus(ProtocolCall::kJoin, absl::UnavailableError("connection refused"), s);
  EXPECT_EQ(d.action, ProtocolAction::kGiveUp);
  EXPECT_EQ(d.exit_code, kWorkerUnreachable);
  EXPECT_EQ(d.reason, "coordinator 10.0.0.1:7777 unreachable for workers.connect_timeout_s = 30 s: connection refused");
}

TEST(ProtocolDecisionTest, JoinTlsFailureGivesUpOnlyWithTlsOn) {
  const absl::Status ssl = absl::UnavailableError("failed to connect: SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED");
  ProtocolState s = State();
  s.tls = true;
  const ProtocolDecision tls = DecideOnStatus(ProtocolCall::kJoin, ssl, s);
  EXPECT_EQ(tls.action, ProtocolAction::kGiveUp);
  EXPECT_EQ(tls.exit_code, kWorkerRefused);
  EXPECT_THAT(tls.reason, HasSubstr("TLS handshake with coordinator 10.0.0.1:7777 failed: failed to connect"));
  EXPECT_THAT(tls.reason, HasSubstr("security.tls_ca must hold the CA"));
  // Without TLS the same text is a coordinator not up yet (or one serving TLS): retry.
  EXPECT_EQ(DecideOnStatus(ProtocolCall::kJoin, ssl, State()).action, ProtocolAction::kRetry);
}

TEST(ProtocolDecisionTest, JoinRetryCarriesTheTlsHint) {
  const absl::Status closed = absl::UnavailableError("Socket closed");
  const ProtocolDecision retry = DecideOnStatus(ProtocolCall::kJoin, closed, State());
  EXPECT_EQ(retry.action, ProtocolAction::kRetry);
  EXPECT_THAT(retry.hint, HasSubstr("the coordinator closed the connection at once: if it serves TLS"));
  EXPECT_EQ(DecideOnStatus(ProtocolCall::kJoin, absl::UnavailableError("connection refused"), State()).hint, "");
  ProtocolState late = State();
  late.connect_deadline_passed = true;
  const ProtocolDecision gone = DecideOnStatus(ProtocolCall::kJoin, closed, late);
  EXPECT_EQ(gone.action, ProtocolAction::kGiveUp);
  EXPECT_EQ(gone.reason,
            "coordinator 10.0.0.1:7777 unreachable for workers.connect_timeout_s = 30 s: Socket closed; " + retry.hint);
}

TEST(ProtocolDecisionTest, AQuarantinedWorkerWaitsInsteadOfTraining) {
  const WaitDecision wait = DecideAfterRefusal({3, false, false, 5}, 2, false);
  EXPECT_EQ(wait.action, WaitAction::kKeepWaiting);
  EXPECT_EQ(wait.reason,
            "quarantined through round 5 (the coordinator's round is 4): waiting instead of training pushes that would "
            "be refused");
  EXPECT_EQ(DecideAfterRefusal({5, false, false, 5}, 2, false).action, WaitAction::kRoundClosed) << "over at round 5";
  EXPECT_EQ(DecideAfterRefusal({3, false, false, 0}, 2, false).action, WaitAction::kRoundClosed)
      << "refused as late only";
  EXPECT_EQ(DecideAfterRefusal({3, false, true, 5}, 2, false).action, WaitAction::kRoundClosed)
      << "the run is complete";
}

// A push for round index 3 refused while that round steps (the coordinator still at 3 completed steps): a pull now
// would give theta_3 again and the worker would train round 4 a second time, to be refused again. It waits for the
// step; once the coordinator is at 4 it pulls. Async rounds move per push: no wait there.
TEST(ProtocolDecisionTest, APushRefusedWhileItsRoundStepsWaitsForTheStep) {
  const WaitDecision wait = DecideAfterRefusal({3, false, false, 0}, 3, false);
  EXPECT_EQ(wait.action, WaitAction::kKeepWaiting);
  EXPECT_EQ(wait.reason, "round 4 is closing: waiting for its outer step (a pull now would give its theta again)");
  EXPECT_EQ(DecideAfterRefusal({4, false, false, 0}, 3, false).action, WaitAction::kRoundClosed);
  // A coordinator restarted from an older checkpoint (round 1 < 3) refuses the push as based on another round: pull
  // its round now; waiting for it to pass round 3 would wait for good (nobody trains round 2).
  EXPECT_EQ(DecideAfterRefusal({1, false, false, 0}, 3, false).action, WaitAction::kRoundClosed);
  EXPECT_EQ(DecideAfterRefusal({3, false, false, 0}, 3, true).action, WaitAction::kRoundClosed);
  EXPECT_EQ(DecideAfterRefusal({3, false, true, 0}, 3, false).action, WaitAction::kRoundClosed) << "complete";
}

// A sync coordinator at the refused round and training (its heartbeat's phase) refused the push for another reason
// than the close: a push cut as late while the round was due to close, one refused while a step that was then
// discarded ran, or one computed against a theta of that round from before a coordinator restart. The open round
// waits for this worker, so it does not wait: it pushes the same result again once, and refused again, pulls now.
// Before, it waited for the round to close, which waited for it (until round_timeout_s, or for good with min_workers
// pushes needed). While the round steps it still waits, and a coordinator that does not send the phase keeps the old
// rule.
TEST(ProtocolDecisionTest, APushRefusedWhileItsRoundTrainsIsPushedAgainOnceThenPulls) {
  HeartbeatView beat{3, false, false, 0};
  beat.phase = "training";
  const WaitDecision again = DecideAfterRefusal(beat, 3, false);
  EXPECT_EQ(again.action, WaitAction::kRepush);
  EXPECT_EQ(again.reason, "round 4 is still open and waits for this worker: pushing the same pseudo-gradient again");
  const WaitDecision pull = DecideAfterRefusal(beat, 3, false, /*repushed=*/true);
  EXPECT_EQ(pull.action, WaitAction::kRoundClosed);
  EXPECT_EQ(pull.reason, "round 4 is still open and refused the push again: pulling its current parameters");
  EXPECT_EQ(DecideAfterRefusal(beat, 3, /*async=*/true).action, WaitAction::kRoundClosed) << "async: no such wait";
  beat.phase = "stepping";
  EXPECT_EQ(DecideAfterRefusal(beat, 3, false).action, WaitAction::kKeepWaiting);
  beat.phase = "finishing";
  EXPECT_EQ(DecideAfterRefusal(beat, 3, false).action, WaitAction::kKeepWaiting);
  beat.phase = "";
  EXPECT_EQ(DecideAfterRefusal(beat, 3, false).action, WaitAction::kKeepWaiting);
  beat.phase = "training";
  beat.quarantined_until_round = 5;
  EXPECT_EQ(DecideAfterRefusal(beat, 3, false).action, WaitAction::kKeepWaiting) << "quarantined: waits still";
}

// Join RESOURCE_EXHAUSTED is the coordinator's "join later" (coordinator.max_members): retried until
// workers.connect_timeout_s, not a refusal (it used to exit 3 at once, also for a member rejoining a full run).
TEST(ProtocolDecisionTest, AFullCoordinatorIsRetriedUntilTheConnectTimeout) {
  const absl::Status full = absl::ResourceExhaustedError(
      "the run has 2 active members (coordinator.max_members); "
      "join later");
  const ProtocolDecision retry = DecideOnStatus(ProtocolCall::kJoin, full, State());
  EXPECT_EQ(retry.action, ProtocolAction::kRetry);
  EXPECT_THAT(retry.reason, HasSubstr("coordinator 10.0.0.1:7777 is full (the run has 2 active members"));
  ProtocolState late = State();
  late.connect_deadline_passed = true;
  const ProtocolDecision gone = DecideOnStatus(ProtocolCall::kJoin, full, late);
  EXPECT_EQ(gone.action, ProtocolAction::kGiveUp);
  EXPECT_EQ(gone.exit_code, kWorkerRefused);
  EXPECT_THAT(gone.reason, HasSubstr("still refuses worker w7 after workers.connect_timeout_s = 30 s"));
}

// A push dropped by a discarded (non-finite) step whose largest norm was this worker's: the heartbeat says not
// counted and quarantined, and the worker waits instead of pushing again to be refused (sync and async alike).
TEST(ProtocolDecisionTest, WaitingWorkerQuarantinedAfterADiscardedStepDoesNotPushAgain) {
  for (const bool async : {false, true}) {
    const WaitDecision wait = DecideWhileWaiting({3, false, false, 4}, 3, async);
    EXPECT_EQ(wait.action, WaitAction::kQuarantined) << async;
    EXPECT_EQ(wait.reason,
              "the push was discarded and this worker is quarantined through round 4 (the coordinator's round is 4); "
              "waiting, then pulling the global model");
    EXPECT_EQ(DecideWhileWaiting({3, false, false, 3}, 3, async).action, WaitAction::kRepush) << "quarantine over";
    EXPECT_EQ(DecideWhileWaiting({3, false, true, 4}, 3, async).action, WaitAction::kRoundClosed) << "complete";
  }
}

TEST(ProtocolDecisionTest, WaitingReadsTheHeartbeat) {
  // sync: round 4 pushed and counted, still open -> wait; moved to 5 -> pull; not counted -> push again.
  EXPECT_EQ(DecideWhileWaiting({4, true, false}, 4, false).action, WaitAction::kKeepWaiting);
  const WaitDecision closed = DecideWhileWaiting({5, false, false}, 4, false);
  EXPECT_EQ(closed.action, WaitAction::kRoundClosed);
  EXPECT_EQ(closed.reason, "the coordinator is at round 6");
  const WaitDecision repush = DecideWhileWaiting({4, false, false}, 4, false);
  EXPECT_EQ(repush.action, WaitAction::kRepush);
  EXPECT_EQ(repush.reason, "the coordinator restarted the round's aggregation; pushing again");
  const WaitDecision complete = DecideWhileWaiting({4, true, true}, 4, false);
  EXPECT_EQ(complete.action, WaitAction::kRoundClosed);
  EXPECT_EQ(complete.reason, "the run is complete");
  // async: a pending push waits even when the round moved on; applied (not pending, round moved) -> pull.
  EXPECT_EQ(DecideWhileWaiting({6, true, false}, 4, true).action, WaitAction::kKeepWaiting);
  EXPECT_EQ(DecideWhileWaiting({6, true, false}, 4, false).action, WaitAction::kRoundClosed);
  const WaitDecision applied = DecideWhileWaiting({5, false, false}, 4, true);
  EXPECT_EQ(applied.action, WaitAction::kRoundClosed);
  EXPECT_EQ(applied.reason, "the push was applied");
  EXPECT_EQ(DecideWhileWaiting({4, false, false}, 4, true).action, WaitAction::kRepush);
  // async, with the coordinator's record of the newest applied push: not pending and the version moved on, but that
  // record is below the push's base -> the push was dropped with its aggregation (another push stepped the version
  // since): push again. Before, it read as applied and the round's work was lost.
  HeartbeatView dropped{5, false, false};
  dropped.last_applied_base = 3;
  const WaitDecision again = DecideWhileWaiting(dropped, 4, true);
  EXPECT_EQ(again.action, WaitAction::kRepush);
  EXPECT_EQ(again.reason,
            "the coordinator no longer holds the push and has not applied it (its aggregation restarted or its step "
            "was discarded); pushing again");
  dropped.last_applied_base = -1;  // none applied yet
  EXPECT_EQ(DecideWhileWaiting(dropped, 4, true).action, WaitAction::kRepush);
  HeartbeatView counted{5, false, false};
  counted.last_applied_base = 4;
  EXPECT_EQ(DecideWhileWaiting(counted, 4, true).action, WaitAction::kRoundClosed);
  counted.pushed = true;  // pending
  EXPECT_EQ(DecideWhileWaiting(counted, 4, true).action, WaitAction::kKeepWaiting);
}

// After a Join the worker checks its config against the run the reply states: chunk sizes whose chunks one side
// cannot receive are refused (the line names both values and the --set), another inner.steps or other rounds are
// warnings, and a reply that says nothing (an older coordinator) passes.
TEST(ProtocolDecisionTest, AJoinedRunWithAnotherChunkSizeIsRefusedAndOtherStepsOrRoundsWarned) {
  Config config;
  config.inner.steps = 100;
  config.outer.rounds = 10;
  config.comm.chunk_bytes = 4 << 20;
  const JoinedRun same{100, 10, 4 << 20, (4 << 20) + (1 << 20)};
  EXPECT_EQ(CheckJoinedRun(config, same).refusal, "");
  EXPECT_TRUE(CheckJoinedRun(config, same).warnings.empty());
  EXPECT_EQ(CheckJoinedRun(config, JoinedRun{}).refusal, "") << "an older coordinator says nothing";

  JoinedRun other = same;
  other.inner_steps = 500;
  const JoinCheck steps = CheckJoinedRun(config, other);
  EXPECT_EQ(steps.refusal, "");
  ASSERT_EQ(steps.warnings.size(), 1u);
  EXPECT_THAT(steps.warnings[0], HasSubstr("inner.steps: the coordinator's run trains 500 inner steps a round and "
                                           "this worker's config 100"));
  EXPECT_THAT(steps.warnings[0], HasSubstr("--set inner.steps=500"));

  other = same;
  other.chunk_bytes = 1 << 20;  // the coordinator takes messages up to 2 MiB; this worker's chunks are 4 MiB
  other.max_message_bytes = 2 << 20;
  EXPECT_THAT(CheckJoinedRun(config, other).refusal, HasSubstr("its pushes would exceed"));
  EXPECT_THAT(CheckJoinedRun(config, other).refusal, HasSubstr("--set comm.chunk_bytes=1048576"));
  other.chunk_bytes = 16 << 20;  // pulls of 16 MiB chunks to a worker that takes 5 MiB
  other.max_message_bytes = 17 << 20;
  EXPECT_THAT(CheckJoinedRun(config, other).refusal, HasSubstr("the coordinator's pulls would exceed"));
  other.chunk_bytes = (4 << 20) + (512 << 10);  // within the 1 MiB slack either way
  other.max_message_bytes = other.chunk_bytes + (1 << 20);
  EXPECT_EQ(CheckJoinedRun(config, other).refusal, "");

  other = same;
  other.rounds_total = 20;
  const JoinCheck rounds = CheckJoinedRun(config, other);
  EXPECT_EQ(rounds.refusal, "");
  ASSERT_EQ(rounds.warnings.size(), 1u);
  EXPECT_THAT(rounds.warnings[0],
              HasSubstr("outer.rounds: the coordinator's run has 20 rounds and this worker's config 10"));
}

// A worker whose pushes keep coming after their round closed is told so once 3 rounds in a row did not count, then
// every 10 rounds; a counted push starts the count over.
TEST(ProtocolDecisionTest, PushesThatDoNotCountRoundsInARowAreWarnedAfterThreeThenEveryTen) {
  UncountedStreak streak;
  std::vector<int64_t> warned;  // the rounds (1-based) with a warning
  auto note = [&](int64_t round, bool counted) {
    const std::string line = streak.Note(round, counted);
    if (line.empty()) return;
    warned.push_back(round + 1);
    EXPECT_THAT(line, HasSubstr("did not count"));
    EXPECT_THAT(line, HasSubstr("coordinator.round_timeout_s"));
  };
  note(0, false);
  note(1, false);
  note(2, true);  // the run is over: three more before a warning
  for (int64_t r = 3; r < 30; ++r) note(r, false);
  EXPECT_EQ(warned, (std::vector<int64_t>{6, 16, 26}));
  EXPECT_THAT(UncountedStreak().Note(0, false), ::testing::IsEmpty());
  UncountedStreak three;
  three.Note(0, false);
  three.Note(1, false);
  EXPECT_THAT(three.Note(2, false), HasSubstr("round 3: the last 3 pushes of this worker did not count"));
}

}  // namespace
}  // namespace diloco
