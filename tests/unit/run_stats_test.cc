// RunStats::CreditRound (coordinator/run_stats.h): a committed round's credits to its members and the run's totals,
// the data-parallel equivalent among them.
#include "coordinator/run_stats.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace diloco {
namespace {

PushTicket Ticket(int64_t tokens, int64_t inner_steps, int64_t bytes) {
  PushTicket t;
  t.tokens = tokens;
  t.inner_steps = inner_steps;
  t.bytes = bytes;
  t.seconds = 2;
  return t;
}

TEST(RunStatsTest, ACommittedRoundCreditsItsMembersAndTheDataParallelEquivalent) {
  Membership members(2);
  members.Join("a", 0);
  members.Join("b", 0);
  RunStats stats;
  stats.CreditRound({{"a", Ticket(100, 10, 4000)}, {"b", Ticket(300, 20, 6000)}}, 1000, members);
  EXPECT_EQ(stats.tokens_committed, 400);
  EXPECT_EQ(stats.bytes_pushed_committed, 10000);
  EXPECT_EQ(stats.last_round_bytes_pushed, 10000);
  // Ring all-reduce of fp32 gradients, k = 2: 2 (k - 1) / k x 4 bytes x params per step: 4000 per step, 30 steps.
  EXPECT_EQ(stats.dp_equivalent_bytes, 30 * 4000);
  EXPECT_EQ(members.Find("b")->rounds_contributed, 1);
  EXPECT_EQ(members.Find("b")->tokens, 300);
  EXPECT_DOUBLE_EQ(members.Find("b")->steps_per_s, 10);
}

// A peer may claim up to 2^31 inner steps: with a billion parameters one push's equivalent passes int64 (converting
// such a double was undefined). The total saturates at int64's largest value.
TEST(RunStatsTest, TheDataParallelEquivalentSaturatesInsteadOfOverflowing) {
  Membership members(2);
  members.Join("a", 0);
  members.Join("b", 0);
  RunStats stats;
  const int64_t steps = int64_t{1} << 31;
  for (int round = 0; round < 3; ++round) {
    stats.CreditRound({{"a", Ticket(1, steps, 1)}, {"b", Ticket(1, steps, 1)}}, 1'000'000'000, members);
    EXPECT_EQ(stats.dp_equivalent_bytes, std::numeric_limits<int64_t>::max()) << round;
  }
}

}  // namespace
}  // namespace diloco
