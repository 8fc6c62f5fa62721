// RoundState (coordinator/round_state.h): the open round's bookkeeping through a push's life, a broken push that
// restarts the aggregation, and a close that moves the counted pushes to the contributors being stepped.
#include "coordinator/round_state.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

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
  r.StartStream("a");
  r.MarkFolded("a");
  EXPECT_TRUE(r.IsStreaming("a"));
  EXPECT_EQ(r.partial_count(), 1u);
  EXPECT_FALSE(r.HasPushed("a"));
  r.EndStream("a");
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
  r.StartStream("c");
  r.MarkFolded("c");
  EXPECT_EQ(r.RestartAggregation(), 2u);
  EXPECT_EQ(r.epoch(), 1);
  EXPECT_FALSE(r.HasPushed("a"));
  EXPECT_FALSE(r.HasPushed("b"));
  EXPECT_EQ(r.partial_count(), 0u);
  EXPECT_TRUE(r.IsStreaming("c"));  // its stream stays open; its ticket is of the old epoch and will be refused
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
