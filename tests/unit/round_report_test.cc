// The round's figures on their way to the coordinator (worker/round_report.h): StepStats add up across the overlap,
// ReportRound maps them once (tokens of every rank, the mean loss over the steps), FillPushHeader writes the wire
// form; and the exit codes a fatal error carries (worker/worker_options.h).
#include "worker/round_report.h"

#include <gtest/gtest.h>

#include "worker/worker_options.h"

namespace diloco {
namespace {

TEST(RoundReportTest, StepStatsOfTwoRunsAddUp) {
  StepStats carried{100, 2, 5.0, 9.0, 1e-3, 1.5, false};  // trained during the last exchange
  StepStats rest{300, 6, 4.0, 21.0, 2e-3, 4.5, false};
  StepStats round;
  round.Add(carried);
  round.Add(rest);
  EXPECT_EQ(round.tokens, 400);
  EXPECT_EQ(round.steps, 8);
  EXPECT_DOUBLE_EQ(round.first_loss, 5.0);  // the first run's first loss, not the later one's
  EXPECT_DOUBLE_EQ(round.loss_sum, 30.0);
  EXPECT_DOUBLE_EQ(round.last_lr, 2e-3);
  EXPECT_DOUBLE_EQ(round.seconds, 6.0);
  EXPECT_FALSE(round.abandoned);
  round.Add(StepStats{0, 0, 0, 0, 0, 0, true});
  EXPECT_TRUE(round.abandoned);
  EXPECT_DOUBLE_EQ(round.last_lr, 2e-3);  // a run of no steps keeps the last lr
}

TEST(RoundReportTest, ReportCountsEveryRankAndAveragesTheLoss) {
  const StepStats stats{400, 8, 5.0, 30.0, 2e-3, 6.0, false};
  const RoundReport report = ReportRound(stats, /*fragment=*/3, /*cluster_size=*/2, /*data_epochs=*/1.25);
  EXPECT_EQ(report.fragment, 3);
  EXPECT_EQ(report.tokens, 800);
  EXPECT_EQ(report.steps, 8);
  EXPECT_DOUBLE_EQ(report.first_loss, 5.0);
  EXPECT_DOUBLE_EQ(report.mean_loss, 3.75);
  EXPECT_DOUBLE_EQ(report.last_lr, 2e-3);
  EXPECT_DOUBLE_EQ(report.seconds, 6.0);
  EXPECT_DOUBLE_EQ(report.data_epochs, 1.25);
  EXPECT_DOUBLE_EQ(ReportRound(StepStats{}, 0, 1, 0).mean_loss, 0.0);  // no steps: no division by zero
}

TEST(RoundReportTest, PushHeaderCarriesTheReport) {
  const RoundReport report = ReportRound(StepStats{400, 8, 5.0, 30.0, 2e-3, 6.0, false}, 1, 1, 0.5);
  PushHeader header;
  header.mutable_meta()->set_round(7);
  FillPushHeader(report, &header);
  EXPECT_EQ(header.meta().round(), 7);  // the meta is the caller's
  EXPECT_EQ(header.tokens(), 400);
  EXPECT_EQ(header.inner_steps(), 8);
  EXPECT_DOUBLE_EQ(header.loss(), 3.75);
  EXPECT_DOUBLE_EQ(header.seconds(), 6.0);
  EXPECT_EQ(header.fragment(), 1);
  EXPECT_DOUBLE_EQ(header.data_epochs(), 0.5);
}

TEST(WorkerExitTest, AFatalErrorCarriesItsExitCode) {
  EXPECT_EQ(ExitCodeOf(absl::OkStatus()), kWorkerDone);
  EXPECT_EQ(ExitCodeOf(absl::NotFoundError("data.text: no file /x")), kWorkerConfigError);  // a start-up step's
  for (WorkerExit code :
       {kWorkerConfigError, kWorkerRefused, kWorkerUnreachable, kWorkerClusterFailed, kWorkerInterrupted}) {
    const absl::Status error = WorkerError(code, "why");
    EXPECT_FALSE(error.ok());
    EXPECT_EQ(error.message(), "why");
    EXPECT_EQ(ExitCodeOf(error), code);
    EXPECT_EQ(ExitCodeOf(WithExitCode(absl::UnavailableError("store"), code)), code);
  }
  EXPECT_TRUE(WithExitCode(absl::OkStatus(), kWorkerRefused).ok());
}

}  // namespace
}  // namespace diloco
