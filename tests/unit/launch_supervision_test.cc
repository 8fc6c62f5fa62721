// The launcher's supervision decision (scripts/launch/supervision.h): for each way a launch can stand, the action, the
// exit code its status picks and the reason; and the error message the launcher takes from a worker's output line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scripts/launch/supervision.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ChildView Running(const std::string& name) { return ChildView{name, true, 0, 0, ""}; }
ChildView Exited(const std::string& name, int code, double at, const std::string& error = "") {
  return ChildView{name, false, code, at, error};
}

SupervisionView Launch(std::vector<ChildView> workers, ChildView coordinator = Running("coordinator")) {
  SupervisionView view;
  view.coordinator = std::move(coordinator);
  view.workers = std::move(workers);
  return view;
}

SupervisionOptions Options() {
  SupervisionOptions o;
  o.worker_grace_s = 30;
  o.completion_grace_s = 45;
  return o;
}

TEST(LaunchSupervisionTest, WaitsWhileEveryWorkerRuns) {
  const SupervisionDecision d = DecideSupervision(Launch({Running("worker-0"), Running("worker-1")}), 10, Options());
  EXPECT_EQ(d.action, SupervisionAction::kWait);
  EXPECT_TRUE(d.status.ok());
  EXPECT_EQ(d.reason, "2 of 2 worker process(es) running");
}

TEST(LaunchSupervisionTest, AWorkerConfigErrorStopsWithItsLineAndExit2) {
  // worker-1 failed first (t=3), worker-0 later (t=4): the first one's line is the one reported; worker-2 runs on.
  const SupervisionView view = Launch({Exited("worker-0", 2, 4, "model.d_model: bad"), Running("worker-2"),
                                       Exited("worker-1", 2, 3, "workers.device: 'cuda' requested but none")});
  const SupervisionDecision d = DecideSupervision(view, 5, Options());
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(d.status), 2);
  EXPECT_EQ(d.status.message(), "worker-1: workers.device: 'cuda' requested but none");
  EXPECT_EQ(d.reason, "worker-1 exited with a configuration error: stopping workers and coordinator");
}

TEST(LaunchSupervisionTest, AConfigErrorWithoutAnErrorLineStillNamesTheWorker) {
  const SupervisionDecision d =
      DecideSupervision(Launch({Exited("worker-0", 2, 1), Running("worker-1")}), 2, Options());
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(d.status), 2);
  EXPECT_THAT(std::string(d.status.message()), HasSubstr("worker-0: exited with code 2 (a configuration error"));
}

TEST(LaunchSupervisionTest, AWorkerThatFailsOrLeavesWhileOthersGoOnDoesNotEndTheLaunch) {
  // Elastic membership: killed (137), refused (3), drained (0): the others go on, so does the run.
  for (int code : {137, 3, 0}) {
    const SupervisionDecision d =
        DecideSupervision(Launch({Exited("worker-0", code, 1, "some error"), Running("worker-1")}), 500, Options());
    EXPECT_EQ(d.action, SupervisionAction::kWait) << code;
    EXPECT_TRUE(d.status.ok()) << code;
    EXPECT_THAT(d.reason, HasSubstr("1 of 2 worker process(es) running; left: worker-0: code " + std::to_string(code)));
  }
  const SupervisionDecision killed =
      DecideSupervision(Launch({Exited("worker-0", 137, 1), Running("worker-1")}), 2, Options());
  EXPECT_THAT(killed.reason, HasSubstr("worker-0: code 137 (signal 9)"));
}

// A worker refused at Join (its config differs from the coordinator's) while the others cannot close a round without
// it: nothing would restart it, so the launch stops with its line and exit 2. Before, the launch waited forever. A
// cluster counts once however many of its ranks run.
TEST(LaunchSupervisionTest, ARefusedWorkerWithoutWhichNoRoundClosesStopsWithItsLineAndExit2) {
  SupervisionOptions options = Options();
  options.min_workers = 2;
  const std::string line = "coordinator 127.0.0.1:5 refused worker worker-1: model config differs";
  const SupervisionDecision d = DecideSupervision(
      Launch({Running("worker-0.0"), Running("worker-0.1"), Exited("worker-1", 3, 2, line)}), 3, options);
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(d.status), 2);
  EXPECT_EQ(d.status.message(), "worker-1: " + line +
                                    " (1 worker(s) still running, fewer than coordinator.min_workers 2: no round "
                                    "could close)");
  EXPECT_EQ(d.reason,
            "worker-1 was refused by the coordinator and no round can close without it: stopping workers and "
            "coordinator");
  // Enough workers left (min_workers 1), or a worker that failed otherwise (killed): elastic membership, wait.
  options.min_workers = 1;
  EXPECT_EQ(DecideSupervision(Launch({Running("worker-0"), Exited("worker-1", 3, 2, line)}), 3, options).action,
            SupervisionAction::kWait);
  options.min_workers = 2;
  EXPECT_EQ(DecideSupervision(Launch({Running("worker-0"), Exited("worker-1", 137, 2)}), 3, options).action,
            SupervisionAction::kWait);
  // The end of a run where a worker was refused long before (min_workers 1 carried on without it): the others exit 0
  // before the coordinator does; that is the run completing, not a refusal to stop on.
  options.min_workers = 1;
  EXPECT_EQ(DecideSupervision(Launch({Exited("worker-0", 0, 50), Exited("worker-1", 3, 2, line), Running("worker-2")}),
                              51, options)
                .action,
            SupervisionAction::kWait);
  options.min_workers = 2;
  EXPECT_EQ(DecideSupervision(Launch({Exited("worker-0", 0, 50), Exited("worker-1", 3, 2, line), Running("worker-2")}),
                              51, options)
                .action,
            SupervisionAction::kWait);
  // A drain before the refusal does not make up for it, nor do the refused cluster's own ranks exiting 0 after it
  // (a leader refused mid-run stops its followers with code 0).
  EXPECT_EQ(DecideSupervision(Launch({Exited("worker-0", 0, 1), Exited("worker-1", 3, 2, line), Running("worker-2")}),
                              3, options)
                .action,
            SupervisionAction::kStop);
  EXPECT_EQ(DecideSupervision(
                Launch({Running("worker-0"), Exited("worker-1.0", 3, 2, line), Exited("worker-1.1", 0, 3)}), 4, options)
                .action,
            SupervisionAction::kStop);
}

TEST(LaunchSupervisionTest, EveryWorkerGoneWithAFailureStopsAtOnceWithExit3) {
  const SupervisionView view = Launch({Exited("worker-0", 137, 10), Exited("worker-1", 137, 11)});
  const SupervisionDecision d = DecideSupervision(view, 11, Options());
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(d.status), 3);
  EXPECT_EQ(d.status.message(),
            "every worker has exited (worker-0: code 137 (signal 9), worker-1: code 137 (signal 9)) and the run has "
            "rounds left; the coordinator was stopped");
  EXPECT_THAT(d.reason, HasSubstr("with rounds left: stopping the coordinator"));
}

TEST(LaunchSupervisionTest, EveryWorkerExited0GivesTheCoordinatorTheCompletionGrace) {
  // Workers exit 0 when they see the run complete; the coordinator then exits by itself. Drained ones exit 0 too,
  // and then it does not: after completion_grace_s (45 s from the last exit, t=12) the launch ends with exit 3.
  const SupervisionView view = Launch({Exited("worker-0", 0, 10), Exited("worker-1", 0, 12)});
  const SupervisionDecision waiting = DecideSupervision(view, 12 + 44.9, Options());
  EXPECT_EQ(waiting.action, SupervisionAction::kWait);
  EXPECT_EQ(waiting.reason,
            "every worker has exited (worker-0: code 0, worker-1: code 0); waiting up to 45 s for the coordinator to "
            "complete the run");
  const SupervisionDecision stop = DecideSupervision(view, 12 + 45, Options());
  EXPECT_EQ(stop.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(stop.status), 3);
  EXPECT_THAT(std::string(stop.status.message()), HasSubstr("did not complete the run within 45 s"));
  EXPECT_EQ(stop.reason, "every worker has exited and the run is not complete: stopping the coordinator");
}

TEST(LaunchSupervisionTest, TheCoordinatorExitingEndsTheRunOnceTheWorkersLeave) {
  const ChildView done = Exited("coordinator", 0, 20);
  const SupervisionDecision all_left =
      DecideSupervision(Launch({Exited("worker-0", 0, 19), Exited("worker-1", 0, 21)}, done), 21, Options());
  EXPECT_EQ(all_left.action, SupervisionAction::kEnd);
  EXPECT_TRUE(all_left.status.ok());
  EXPECT_EQ(all_left.reason, "the coordinator exited (code 0) and every worker has exited");

  const SupervisionView one_left = Launch({Exited("worker-0", 0, 19), Running("worker-1")}, done);
  const SupervisionDecision waiting = DecideSupervision(one_left, 20 + 29, Options());
  EXPECT_EQ(waiting.action, SupervisionAction::kWait);
  EXPECT_EQ(waiting.reason, "the coordinator exited (code 0); waiting up to 30 s for 1 worker process(es) to leave");
  const SupervisionDecision late = DecideSupervision(one_left, 20 + 30, Options());
  EXPECT_EQ(late.action, SupervisionAction::kEnd);
  EXPECT_EQ(late.reason, "the coordinator exited (code 0) 30 s ago; stopping the 1 worker process(es) still running");
}

TEST(LaunchSupervisionTest, ACoordinatorThatExitsBeforeListeningEndsTheRun) {
  const SupervisionDecision d = DecideSupervision(Launch({}, Exited("coordinator", 2, 1)), 1, Options());
  EXPECT_EQ(d.action, SupervisionAction::kEnd);
  EXPECT_EQ(d.reason, "the coordinator exited (code 2) and every worker has exited");
}

TEST(LaunchSupervisionTest, ASignalStopsEverythingWithExit130BeforeAnyOtherRule) {
  SupervisionView view = Launch({Exited("worker-0", 2, 1, "bad key")});
  view.signal = 2;
  const SupervisionDecision d = DecideSupervision(view, 2, Options());
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(ExitCodeOf(d.status), 130);
  EXPECT_EQ(d.reason, "signal 2: stopping workers and coordinator");
}

TEST(LaunchSupervisionTest, AConfigErrorWinsOverACoordinatorThatExited) {
  const SupervisionDecision d = DecideSupervision(
      Launch({Exited("worker-0", 2, 1, "bad key"), Running("worker-1")}, Exited("coordinator", 130, 2)), 3, Options());
  EXPECT_EQ(d.action, SupervisionAction::kStop);
  EXPECT_EQ(d.status.message(), "worker-0: bad key");
}

TEST(LaunchSupervisionTest, PureSameInputsSameAnswer) {
  const SupervisionView view = Launch({Exited("worker-0", 0, 0)});
  EXPECT_EQ(DecideSupervision(view, 44.999, Options()).action, SupervisionAction::kWait);
  EXPECT_EQ(DecideSupervision(view, 45, Options()).action, SupervisionAction::kStop);
  EXPECT_EQ(DecideSupervision(view, 44.999, Options()).action, SupervisionAction::kWait);
}

TEST(LaunchSupervisionTest, ExitCodes) {
  EXPECT_EQ(ExitCodeOf(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeOf(absl::CancelledError("signal 15")), 130);
  EXPECT_EQ(ExitCodeOf(absl::UnavailableError("no workers")), 3);
  EXPECT_EQ(ExitCodeOf(absl::AbortedError("cannot start worker-0")), 1);
  EXPECT_EQ(ExitCodeOf(absl::InvalidArgumentError("unknown key")), 2);
  EXPECT_EQ(ExitCodeOf(absl::NotFoundError("no such file")), 2);
  EXPECT_EQ(ExitCodeOf(absl::FailedPreconditionError("token data")), 2);
}

TEST(LaunchSupervisionTest, ErrorMessageOfALogLine) {
  EXPECT_EQ(ErrorMessageOf("23:21:00.123 error worker-1: workers.device: 'cuda' requested but none"),
            "workers.device: 'cuda' requested but none");
  EXPECT_EQ(ErrorMessageOf("23:21:00.123 critical worker-1.0: it broke: badly"), "it broke: badly");
  EXPECT_EQ(ErrorMessageOf("diloco-worker: --id: must not be empty"), "--id: must not be empty");
  EXPECT_EQ(ErrorMessageOf("diloco-worker: error: model.d_model: bad"), "model.d_model: bad");
  EXPECT_EQ(ErrorMessageOf("23:21:00.123 info worker-1: round 1 closed"), "");
  EXPECT_EQ(ErrorMessageOf("23:21:00.123 warn worker-1: error in the name"), "");
  EXPECT_EQ(ErrorMessageOf("error: not a log line"), "");
  EXPECT_EQ(ErrorMessageOf(""), "");
}

}  // namespace
}  // namespace diloco
