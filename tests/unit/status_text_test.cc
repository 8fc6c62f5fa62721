// StatusToText (proto/status_text.h), the table `diloco-ctl status` prints: the remark lines under the member table.
// A member whose last push lay far beyond the robust limits, or that is suspect, gets a line of its own; the members
// clipped or bounded only a little (about half of the honest pushes under outer.aggregation clip, every round) share
// one line, so an operator's eye goes to the few that matter.
#include "proto/status_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

WorkerStatus* AddMember(StatusReply& s, const std::string& id, double clip_scale, int64_t far_in_a_row) {
  WorkerStatus* w = s.add_workers();
  w->set_id(id);
  w->set_state("active");
  w->set_last_push_norm(2.5);
  w->set_last_clip_scale(clip_scale);
  w->set_clipped_in_a_row(far_in_a_row);
  return w;
}

// The first line numbers the round under way as the logs do: with 24 of 40 rounds done, round 25 waits for its
// pushes (the coordinator logs "round 25: waiting for pushes"). Before, it read "round 24/40, phase training".
TEST(StatusTextTest, TheFirstLineNumbersTheRoundUnderWayAsTheLogsDo) {
  StatusReply s;
  s.set_run_name("tiny");
  s.set_round(24);
  s.set_rounds_total(40);
  s.set_phase("training");
  s.set_phase_reason("waiting for pushes: 1 of min_workers 2 received");
  EXPECT_THAT(StatusToText(s),
              ::testing::StartsWith("run tiny: 24/40 rounds done; round 25 training: waiting for pushes: 1 of "
                                    "min_workers 2 received\n"));
  s.set_round(40);
  s.set_phase("finishing");  // the last round is published, its checkpoint under way: no round 41
  s.set_phase_reason("");
  EXPECT_THAT(StatusToText(s), ::testing::StartsWith("run tiny: 40/40 rounds done; finishing\n"));
  s.set_phase("complete");
  EXPECT_THAT(StatusToText(s), ::testing::StartsWith("run tiny: 40/40 rounds done; complete\n"));
}

TEST(StatusTextTest, OnlyMembersFarBeyondTheLimitsGetALineOfTheirOwn) {
  StatusReply s;
  s.set_run_name("r");
  AddMember(s, "honest-a", 0.93, 0);
  AddMember(s, "honest-b", 1.0, 0);
  AddMember(s, "honest-c", 0.871, 0)->set_momentum_bounded(true);
  AddMember(s, "drifting", 0.25, 2);
  WorkerStatus* bad = AddMember(s, "bad", 0.001, 3);
  bad->set_suspect(true);
  bad->set_momentum_bounded(true);
  bad->set_momentum_cosine(-0.5);
  WorkerStatus* trimmed = AddMember(s, "trimmed", 1.0, 1);  // outer.aggregation trimmed_mean: scale 1, share dropped
  trimmed->set_trimmed_share(0.96875);
  WorkerStatus* stale = AddMember(s, "stale", 1.0, 3);  // trimmed_mean: far along the momentum, which is not bounded
  stale->set_suspect(true);
  stale->set_momentum_cosine(0.42);
  stale->set_trimmed_share(0.5);
  const std::string text = StatusToText(s);

  EXPECT_THAT(text, HasSubstr("clipped within the flag margin: honest-a x0.93, honest-c x0.871\n"));
  EXPECT_THAT(text, HasSubstr("bounded along the outer momentum within the flag margin: honest-c (cosine 0)\n"));
  EXPECT_THAT(text, HasSubstr("far beyond: drifting last push norm 2.5 scaled by 0.25; far beyond the limits 2 rounds "
                              "in a row\n"));
  EXPECT_THAT(text, HasSubstr("suspect: bad last push norm 2.5 scaled by 0.001, bounded along the outer momentum "
                              "(cosine -0.5); far beyond the limits 3 rounds in a row (operators decide: diloco-ctl "
                              "leave --id bad)\n"));
  EXPECT_THAT(text, HasSubstr("far beyond: trimmed last push norm 2.5, dropped by the trim at 96.9% of its "
                              "coordinates; far beyond the limits 1 rounds in a row\n"));
  EXPECT_THAT(text, HasSubstr("suspect: stale last push norm 2.5, cosine 0.42 with the outer momentum, dropped by the "
                              "trim at 50.0% of its coordinates; far beyond the limits 3 rounds in a row (operators "
                              "decide: diloco-ctl leave --id stale)\n"));
  // No member gets a remark line of its own unless it is far beyond the limits or suspect.
  EXPECT_THAT(text, Not(HasSubstr("\nclipped: ")));  // the line each clipped member had before
  EXPECT_THAT(text, Not(HasSubstr("\nbounded: ")));
  EXPECT_THAT(text, Not(HasSubstr("beyond: honest")));
  EXPECT_THAT(text, Not(HasSubstr("honest-b x")));  // not clipped at all
}

TEST(StatusTextTest, AnHonestRoundPrintsNoRemarkLines) {
  StatusReply s;
  AddMember(s, "w0", 1.0, 0);
  AddMember(s, "w1", 0, 0);  // 0: no clip rule (outer.aggregation mean)
  s.add_evals()->set_round(1);
  const std::string text = StatusToText(s);
  EXPECT_THAT(text, Not(HasSubstr("clipped")));
  EXPECT_THAT(text, Not(HasSubstr("far beyond")));
  EXPECT_THAT(text, Not(HasSubstr("suspect")));
  EXPECT_THAT(text, HasSubstr("val_loss: r1=0.0000\n"));
  EXPECT_THAT(text, HasSubstr("\nw0 "));  // the member table still lists both
  EXPECT_THAT(text, HasSubstr("\nw1 "));
}

}  // namespace
}  // namespace diloco
