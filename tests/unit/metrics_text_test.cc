// The Prometheus text formatter (coordinator/metrics_text.h) on hand-built StatusReplies: the exact exposition,
// figures left out when the coordinator does not have them, label escaping and number formatting.
#include "coordinator/metrics_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/round_phase.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

StatusReply TwoWorkers() {
  StatusReply s;
  s.set_round(2);
  s.set_rounds_total(3);
  s.set_phase("training");
  s.set_params(1000);
  s.set_bytes_received(9000);
  s.set_bytes_sent(12000);
  s.set_bytes_pushed_committed(8000);
  s.set_dp_equivalent_bytes(160000);
  s.set_last_round_bytes_pushed(4000);
  s.set_last_outer_step_seconds(0.125);
  s.set_last_round_seconds(2.5);
  WorkerStatus* a = s.add_workers();
  a->set_id("w0");
  a->set_state("active");
  a->set_rounds_contributed(2);
  a->set_tokens(5120);
  a->set_last_loss(3.25);
  a->set_tokens_per_s(1234.5);
  a->set_bytes_pushed(8000);
  a->set_heartbeat_age_s(0.5);
  a->set_last_push_norm(12.5);
  a->set_last_clip_scale(1);
  WorkerStatus* b = s.add_workers();  // joined, never pushed, then went silent
  b->set_id("w1");
  b->set_broken_pushes(3);  // its pushes broke off three times in a row: quarantined
  b->set_quarantined_until_round(4);
  b->set_last_push_norm(2000);  // and its pushes were clipped (outer.aggregation clip) until it became suspect
  b->set_last_clip_scale(0.25);
  b->set_clipped_in_a_row(3);
  b->set_suspect(true);
  b->set_duplicate_pushes(2);
  b->set_momentum_cosine(0.375);  // its last push leaned on the outer momentum (outer.momentum_bound)
  b->set_momentum_bounded(true);
  b->set_trimmed_share(0.875);  // outer.aggregation trimmed_mean: dropped at 7/8 of its coordinates
  b->set_state("lost");
  b->set_heartbeat_age_s(12);
  for (auto [round, loss] : {std::pair<int, double>{0, 4.5}, {1, 4.0}, {2, 3.75}}) {
    EvalPoint* e = s.add_evals();
    e->set_round(round);
    e->set_val_loss(loss);
  }
  return s;
}

TEST(MetricsTextTest, ExactExposition) {
  const std::string expected = R"(# HELP diloco_round Completed outer steps (rounds) t.
# TYPE diloco_round gauge
diloco_round 2
# HELP diloco_rounds_planned Rounds the run is configured for (outer.rounds; x comm.fragments with Streaming DiLoCo).
# TYPE diloco_rounds_planned gauge
diloco_rounds_planned 3
# HELP diloco_phase 1 for the coordinator's current phase, 0 for the others.
# TYPE diloco_phase gauge
diloco_phase{phase="training"} 1
diloco_phase{phase="stepping"} 0
diloco_phase{phase="finishing"} 0
diloco_phase{phase="complete"} 0
# HELP diloco_parameters Parameters of the model (elements of theta).
# TYPE diloco_parameters gauge
diloco_parameters 1000
# HELP diloco_members Workers known to the coordinator, by membership state.
# TYPE diloco_members gauge
diloco_members{state="active"} 1
diloco_members{state="lost"} 1
diloco_members{state="left"} 0
# HELP diloco_val_loss Validation loss (nats/token) of the global model at the newest eval.
# TYPE diloco_val_loss gauge
diloco_val_loss 3.75
# HELP diloco_val_loss_round Round of the newest validation eval.
# TYPE diloco_val_loss_round gauge
diloco_val_loss_round 2
# HELP diloco_tokens_total Training tokens of all workers in committed rounds.
# TYPE diloco_tokens_total counter
diloco_tokens_total 5120
# HELP diloco_bytes_received_total Pseudo-gradient chunk bytes the coordinator received (every push, committed or not).
# TYPE diloco_bytes_received_total counter
diloco_bytes_received_total 9000
# HELP diloco_bytes_sent_total Parameter chunk bytes the coordinator sent to pulling workers.
# TYPE diloco_bytes_sent_total counter
diloco_bytes_sent_total 12000
# HELP diloco_bytes_pushed_committed_total Pseudo-gradient bytes pushed in rounds that were committed.
# TYPE diloco_bytes_pushed_committed_total counter
diloco_bytes_pushed_committed_total 8000
# HELP diloco_dp_equivalent_bytes_total Bytes ring all-reduce of fp32 gradients every inner step would have sent for the same committed rounds.
# TYPE diloco_dp_equivalent_bytes_total counter
diloco_dp_equivalent_bytes_total 160000
# HELP diloco_last_round_bytes_pushed Pseudo-gradient bytes pushed in the last committed round.
# TYPE diloco_last_round_bytes_pushed gauge
diloco_last_round_bytes_pushed 4000
# HELP diloco_last_outer_step_seconds Seconds the last outer optimizer step took.
# TYPE diloco_last_outer_step_seconds gauge
diloco_last_outer_step_seconds 0.125
# HELP diloco_last_round_seconds Seconds from the previous commit to the last one (the round's training, pushes and outer step).
# TYPE diloco_last_round_seconds gauge
diloco_last_round_seconds 2.5
# HELP diloco_worker_state 1 for each worker's membership state.
# TYPE diloco_worker_state gauge
diloco_worker_state{worker="w0",state="active"} 1
diloco_worker_state{worker="w1",state="lost"} 1
# HELP diloco_worker_tokens_total Training tokens of the worker in committed rounds.
# TYPE diloco_worker_tokens_total counter
diloco_worker_tokens_total{worker="w0"} 5120
diloco_worker_tokens_total{worker="w1"} 0
# HELP diloco_worker_rounds_contributed_total Committed rounds the worker's pushes were part of.
# TYPE diloco_worker_rounds_contributed_total counter
diloco_worker_rounds_contributed_total{worker="w0"} 2
diloco_worker_rounds_contributed_total{worker="w1"} 0
# HELP diloco_worker_bytes_pushed_total Pseudo-gradient bytes the worker pushed in committed rounds.
# TYPE diloco_worker_bytes_pushed_total counter
diloco_worker_bytes_pushed_total{worker="w0"} 8000
diloco_worker_bytes_pushed_total{worker="w1"} 0
# HELP diloco_worker_broken_pushes_total Pushes of the worker that broke off after folding chunks (each restarted its round's aggregation).
# TYPE diloco_worker_broken_pushes_total counter
diloco_worker_broken_pushes_total{worker="w0"} 0
diloco_worker_broken_pushes_total{worker="w1"} 3
# HELP diloco_worker_quarantined 1 while the worker's pushes are refused after repeated broken pushes (until quarantined_until_round).
# TYPE diloco_worker_quarantined gauge
diloco_worker_quarantined{worker="w0"} 0
diloco_worker_quarantined{worker="w1"} 1
# HELP diloco_worker_push_norm L2 norm of the worker's last counted pseudo-gradient (0 before one).
# TYPE diloco_worker_push_norm gauge
diloco_worker_push_norm{worker="w0"} 12.5
diloco_worker_push_norm{worker="w1"} 2000
# HELP diloco_worker_clip_scale The factor outer.aggregation clip scaled the worker's last counted push by (1: not clipped).
# TYPE diloco_worker_clip_scale gauge
diloco_worker_clip_scale{worker="w0"} 1
diloco_worker_clip_scale{worker="w1"} 0.25
# HELP diloco_worker_momentum_cosine outer.momentum_bound (clip, trimmed_mean, centered_clip): the cosine of the worker's last counted push with the outer momentum.
# TYPE diloco_worker_momentum_cosine gauge
diloco_worker_momentum_cosine{worker="w0"} 0
diloco_worker_momentum_cosine{worker="w1"} 0.375
# HELP diloco_worker_momentum_bounded 1 when the worker's last counted push was bounded along the outer momentum (outer.momentum_bound).
# TYPE diloco_worker_momentum_bounded gauge
diloco_worker_momentum_bounded{worker="w0"} 0
diloco_worker_momentum_bounded{worker="w1"} 1
# HELP diloco_worker_trimmed_share outer.aggregation trimmed_mean: the share of the worker's last counted push's coordinates the trim dropped.
# TYPE diloco_worker_trimmed_share gauge
diloco_worker_trimmed_share{worker="w0"} 0
diloco_worker_trimmed_share{worker="w1"} 0.875
# HELP diloco_worker_suspect 1 once the worker's pushes lay far beyond the clip, bound or trim (outer.flag_margin) outer.flag_rounds rounds in a row.
# TYPE diloco_worker_suspect gauge
diloco_worker_suspect{worker="w0"} 0
diloco_worker_suspect{worker="w1"} 1
# HELP diloco_worker_duplicate_pushes_total The worker's pushes refused as byte-identical to another push of the round or of the previous round.
# TYPE diloco_worker_duplicate_pushes_total counter
diloco_worker_duplicate_pushes_total{worker="w0"} 0
diloco_worker_duplicate_pushes_total{worker="w1"} 2
# HELP diloco_worker_heartbeat_age_seconds Seconds since the worker was last heard from.
# TYPE diloco_worker_heartbeat_age_seconds gauge
diloco_worker_heartbeat_age_seconds{worker="w0"} 0.5
diloco_worker_heartbeat_age_seconds{worker="w1"} 12
# HELP diloco_worker_tokens_per_second Inner-loop training throughput of the worker's last push (absent before its first push).
# TYPE diloco_worker_tokens_per_second gauge
diloco_worker_tokens_per_second{worker="w0"} 1234.5
# HELP diloco_worker_last_loss Training loss (nats/token) the worker reported with its last push (absent before its first push).
# TYPE diloco_worker_last_loss gauge
diloco_worker_last_loss{worker="w0"} 3.25
)";
  EXPECT_EQ(MetricsText(TwoWorkers()), expected);
}

TEST(MetricsTextTest, NoEvalMeansNoValidationLossLine) {
  StatusReply s = TwoWorkers();
  s.clear_evals();
  const std::string text = MetricsText(s);
  EXPECT_THAT(text, Not(HasSubstr("diloco_val_loss")));
  EXPECT_THAT(text, HasSubstr("\ndiloco_round 2\n"));
}

// diloco_phase has one series per RoundPhase (proto/round_phase.h), whatever the reply says: each can be 1, and a
// name outside the enum adds no series (the label set is fixed).
TEST(MetricsTextTest, PhaseSeriesAreTheFixedSetOfRoundPhases) {
  for (const auto& [phase, name] : kRoundPhases) {
    StatusReply s;
    s.set_phase(std::string(name));
    const std::string text = MetricsText(s);
    for (const auto& [other, other_name] : kRoundPhases) {
      EXPECT_THAT(text, HasSubstr(absl::StrCat("\ndiloco_phase{phase=\"", std::string(other_name), "\"} ",
                                               other == phase ? 1 : 0, "\n")))
          << name;
    }
  }
  EXPECT_EQ(RoundPhaseName(RoundPhase::kFinishing), "finishing");
  StatusReply unknown;
  unknown.set_phase("resuming");
  const std::string text = MetricsText(unknown);
  EXPECT_THAT(text, Not(HasSubstr("resuming")));
  EXPECT_THAT(text, Not(HasSubstr("waiting")));
  EXPECT_THAT(text, HasSubstr("\ndiloco_phase{phase=\"training\"} 0\n"));
}

TEST(MetricsTextTest, PushedThisRoundCountsAsReportedAndUnknownStatesGetTheirOwnLabel) {
  StatusReply s;
  s.set_phase("resuming");  // not one of the known phases: no series of its own, every known one 0
  WorkerStatus* w = s.add_workers();
  w->set_id("late");
  w->set_state("joining");
  w->set_pushed_this_round(true);
  w->set_last_loss(5.5);
  w->set_tokens_per_s(100);
  const std::string text = MetricsText(s);
  EXPECT_THAT(text, Not(HasSubstr("\ndiloco_phase{phase=\"resuming\"}")));
  EXPECT_THAT(text, HasSubstr("\ndiloco_phase{phase=\"training\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\ndiloco_members{state=\"active\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\ndiloco_members{state=\"joining\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\ndiloco_worker_last_loss{worker=\"late\"} 5.5\n"));
  EXPECT_THAT(text, HasSubstr("\ndiloco_worker_tokens_per_second{worker=\"late\"} 100\n"));
}

TEST(MetricsTextTest, EveryLineIsValidExpositionAndEverySampleHasATypedFamily) {
  StatusReply s = TwoWorkers();
  s.mutable_workers(0)->set_id("odd \"id\"\\with\nnewline");
  const std::string label = R"([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")";  // name="escaped value"
  const std::regex sample("^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{" + label + "(," + label + ")*\\})? " +
                          "(-?[0-9.e+-]+|NaN|[+-]Inf)$");
  const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter)$)");
  std::set<std::string> typed;
  std::istringstream in(MetricsText(s));
  int samples = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, type_line)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "family typed twice: " << line;
    } else if (line.rfind("# HELP ", 0) == 0) {
      continue;
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a valid sample line: " << line;
      EXPECT_EQ(typed.count(m[1]), 1u) << "sample before its TYPE line: " << line;
      ++samples;
    }
  }
  EXPECT_GT(samples, 30);
  EXPECT_THAT(MetricsText(s), HasSubstr("{worker=\"odd \\\"id\\\"\\\\with\\nnewline\"}"));
}

TEST(MetricsTextTest, LabelEscaping) {
  EXPECT_EQ(EscapeLabelValue("plain-id_1"), "plain-id_1");
  EXPECT_EQ(EscapeLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("a\nb"), "a\\nb");
}

TEST(MetricsTextTest, SampleValues) {
  EXPECT_EQ(FormatSampleValue(0), "0");
  EXPECT_EQ(FormatSampleValue(3), "3");
  EXPECT_EQ(FormatSampleValue(-2.5), "-2.5");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(3.8092712345678), "3.8092712345678");  // shortest form that reads back exactly
  EXPECT_EQ(FormatSampleValue(1e-7), "1e-07");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

}  // namespace
}  // namespace diloco
