// RoundState (coordinator/round_state.h): the open round's bookkeeping through a push's life, a broken push that
// restarts the aggregation, and a close that moves the counted pushes to the contributors being stepped.
#include "coordinator/round_state.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace diloco {
namespace {

PushTicket Ticket(const std::string& id, int64_t tokens) {
  PushTicket t;
  t.worker_id = id;
  t.tokens = tokens;
  return t;
}

TEST(RoundStateTest, APushStreamsFoldsAndIsCounted) {
  RoundState r;
  EXPECT_EQ(r.phase(), RoundPhase::kTraining);
  const int64_t serial = r.StartStream("a", 0);
  EXPECT_EQ(r.partial_count(), 0u) << "nothing folded yet";
  r.MarkFolded("a", 1);
  EXPECT_TRUE(r.IsStreaming("a"));
  EXPECT_TRUE(r.IsCurrent("a", serial));
  EXPECT_EQ(r.partial_count(), 1u);
  EXPECT_FALSE(r.HasPushed("a"));
  r.EndStream("a", serial);
  r.Count(Ticket("a", 10));
  EXPECT_FALSE(r.IsStreaming("a"));
  EXPECT_EQ(r.partial_count(), 0u);
  EXPECT_TRUE(r.HasPushed("a"));
  EXPECT_TRUE(r.CountsAsPushed("a"));
  EXPECT_EQ(r.PushedIds(), (std::set<std::string>{"a"}));
  EXPECT_EQ(r.epoch(), 0);
}

TEST(RoundStateTest, RestartDropsCountedAndPartFoldedPushesInANewEpoch) {
  RoundState r;
  r.Count(Ticket("a", 10));
  r.Count(Ticket("b", 20));
  r.StartStream("c", 0);
  r.MarkFolded("c", 0);
  EXPECT_EQ(r.RestartAggregation(), 2u);
  EXPECT_EQ(r.epoch(), 1);
  EXPECT_FALSE(r.HasPushed("a"));
  EXPECT_FALSE(r.HasPushed("b"));
  EXPECT_EQ(r.partial_count(), 0u);
  EXPECT_TRUE(r.IsStreaming("c"));  // its stream stays open; its ticket is of the old epoch and will be refused
}

TEST(RoundStateTest, StalledStreamsAreThoseWithoutProgressOrOpenTooLongAndACutOneIsNoLongerCurrent) {
  RoundState r;
  const int64_t a = r.StartStream("a", 0);  // folds at 5, then stalls
  r.MarkFolded("a", 5);
  const int64_t b = r.StartStream("b", 0);  // folds steadily but has been open too long
  r.MarkFolded("b", 29);
  r.StartStream("c", 20);  // opened late, nothing folded, not silent long enough yet
  EXPECT_TRUE(r.StalledStreams(14, 10, 30).empty());
  EXPECT_EQ(r.StalledStreams(16, 10, 30), (std::vector<std::string>{"a"}));
  EXPECT_EQ(r.StalledStreams(31, 10, 30), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(r.CutStream("a")) << "it had chunks in the sums";
  EXPECT_FALSE(r.IsCurrent("a", a));
  EXPECT_FALSE(r.IsStreaming("a"));
  EXPECT_FALSE(r.CutStream("c")) << "nothing folded";
  EXPECT_EQ(r.partial_count(), 1u);
  // The same worker's next stream is a new serial; the cut one ending later does not end it.
  const int64_t a2 = r.StartStream("a", 40);
  EXPECT_NE(a2, a);
  r.EndStream("a", a);
  EXPECT_TRUE(r.IsCurrent("a", a2));
  r.EndStream("b", b);
  EXPECT_EQ(r.streaming_count(), 1u);
}

TEST(RoundStateTest, CloseMovesPushesToContributorsWhoStillCountAsPushedUntilTheStepEnds) {
  RoundState r;
  r.Count(Ticket("a", 10));
  r.Count(Ticket("b", 20));
  const RoundState::Pushes contributors = r.TakeForClose();
  ASSERT_EQ(contributors.size(), 2u);
  EXPECT_EQ(contributors.at("b").tokens, 20);
  EXPECT_EQ(r.phase(), RoundPhase::kStepping);
  EXPECT_EQ(r.epoch(), 1);
  EXPECT_FALSE(r.HasPushed("a"));      // not in the next round
  EXPECT_TRUE(r.CountsAsPushed("a"));  // but its heartbeat still says pushed while the step runs
  EXPECT_FALSE(r.CountsAsPushed("z"));
  r.EndClose(RoundPhase::kFinishing);
  EXPECT_FALSE(r.CountsAsPushed("a"));
  EXPECT_EQ(r.phase(), RoundPhase::kFinishing);
}

}  // namespace
}  // namespace diloco
