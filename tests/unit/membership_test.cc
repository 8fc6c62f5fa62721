// Membership (coordinator/membership.h): shard assignment, leases, rejoin, leave; clock injected.
#include "coordinator/membership.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace diloco {
namespace {

using Ids = std::vector<std::string>;

TEST(MembershipTest, JoinAssignsLowestFreeShard) {
  Membership m(4);
  EXPECT_EQ(m.Join("a", 0).shard_index, 0);
  EXPECT_EQ(m.Join("b", 0).shard_index, 1);
  EXPECT_EQ(m.Join("c", 0).shard_index, 2);
  m.Leave("b", 1);
  EXPECT_EQ(m.Join("d", 1).shard_index, 1) << "b's shard is free again";
  EXPECT_EQ(m.Join("e", 1).shard_index, 3);
  EXPECT_EQ(m.ActiveIds(), (Ids{"a", "c", "d", "e"}));
  EXPECT_EQ(m.shard_count(), 4);
}

TEST(MembershipTest, NewMemberGetsShardHintWhenFree) {
  Membership m(4);
  EXPECT_EQ(m.Join("a", 0, /*shard_hint=*/2).shard_index, 2);
  EXPECT_EQ(m.Join("b", 0, /*shard_hint=*/2).shard_index, 0) << "hint taken: lowest free";
  EXPECT_EQ(m.Join("c", 0, /*shard_hint=*/4).shard_index, 1) << "hint out of range: lowest free";
  EXPECT_EQ(m.Join("d", 0, /*shard_hint=*/-1).shard_index, 3);
}

TEST(MembershipTest, JoinRecordsTimes) {
  Membership m(2);
  const Member& a = m.Join("a", 12.5);
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.state, MemberState::kActive);
  EXPECT_DOUBLE_EQ(a.joined_at, 12.5);
  EXPECT_DOUBLE_EQ(a.last_seen, 12.5);
  EXPECT_TRUE(m.Touch("a", 20.0));
  EXPECT_DOUBLE_EQ(m.Find("a")->last_seen, 20.0);
  EXPECT_DOUBLE_EQ(m.Find("a")->joined_at, 12.5);
  EXPECT_FALSE(m.Touch("nobody", 20.0));
  EXPECT_EQ(m.Find("nobody"), nullptr);
}

TEST(MembershipTest, LeaseExpiryMarksLost) {
  Membership m(2);
  m.Join("a", 0);
  m.Join("b", 0);
  m.Touch("a", 8);
  EXPECT_TRUE(m.ExpireLeases(10, 10).empty()) << "silent exactly lease_s is not yet lost";
  EXPECT_EQ(m.ExpireLeases(10.5, 10), (Ids{"b"}));
  EXPECT_EQ(m.Find("b")->state, MemberState::kLost);
  EXPECT_FALSE(m.IsActive("b"));
  EXPECT_TRUE(m.IsActive("a"));
  EXPECT_EQ(m.ActiveIds(), (Ids{"a"}));
  EXPECT_FALSE(m.Touch("b", 11)) << "a lost member must join again";
  EXPECT_TRUE(m.ExpireLeases(11, 10).empty()) << "lost once, reported once";
  EXPECT_EQ(m.ExpireLeases(18.5, 10), (Ids{"a"}));
}

TEST(MembershipTest, RejoinReactivatesWithSameShard) {
  Membership m(3);
  m.Join("a", 0);
  m.Join("b", 0);
  m.Join("c", 0);
  ASSERT_EQ(m.Find("b")->shard_index, 1);
  m.ExpireLeases(100, 10);  // everyone lost
  EXPECT_TRUE(m.ActiveIds().empty());
  const Member& b = m.Join("b", 101);
  EXPECT_EQ(b.state, MemberState::kActive);
  EXPECT_EQ(b.shard_index, 1);
  EXPECT_DOUBLE_EQ(b.last_seen, 101);
  EXPECT_DOUBLE_EQ(b.joined_at, 0) << "a rejoin is the same member";
  EXPECT_EQ(m.members().size(), 3u);
}

TEST(MembershipTest, LeaveMarksLeft) {
  Membership m(2);
  m.Join("a", 0);
  m.Leave("a", 1);
  EXPECT_EQ(m.Find("a")->state, MemberState::kLeft);
  EXPECT_STREQ(MemberStateName(m.Find("a")->state), "left");
  EXPECT_FALSE(m.IsActive("a"));
  EXPECT_TRUE(m.ExpireLeases(1000, 1).empty()) << "a member that left is not also lost";
  m.Leave("unknown", 1);  // no effect, no crash
  EXPECT_EQ(m.members().size(), 1u);
  EXPECT_EQ(m.Join("a", 5).shard_index, 0);
  EXPECT_TRUE(m.IsActive("a"));
}

// Active members own disjoint shards (membership.h). Each active member's shard must be unique.
// A lost member that rejoins after its shard was given to another gets the lowest free shard instead.
TEST(MembershipTest, RejoinAfterShardWasReassignedKeepsShardsDisjoint) {
  Membership m(2);
  m.Join("a", 0);          // shard 0
  m.Join("b", 0);          // shard 1
  m.ExpireLeases(20, 10);  // a and b lost
  m.Join("c", 21);         // lowest free: shard 0
  m.Join("a", 22);         // rejoins: keeps shard 0 today
  std::set<int> shards;
  for (const std::string& id : m.ActiveIds()) shards.insert(m.Find(id)->shard_index);
  EXPECT_EQ(shards.size(), m.ActiveIds().size()) << "two active members share a shard";
}

// More active members than shards: they wrap around, and each reader of a shared shard has its own reader number
// (the worker seeds its sampler with it: sharers draw different windows). A member keeps its number while it is free.
TEST(MembershipTest, MembersThatShareAShardGetDistinctReaderNumbers) {
  Membership m(2);
  EXPECT_EQ(m.Join("a", 0).shard_reader, 0);
  EXPECT_EQ(m.Join("b", 0).shard_reader, 0);
  const Member& c = m.Join("c", 0);
  EXPECT_EQ(c.shard_index, 0);
  EXPECT_EQ(c.shard_reader, 1) << "c shares a's shard";
  const Member& d = m.Join("d", 0);
  EXPECT_EQ(d.shard_index, 0) << "the lowest index when every shard is taken";
  EXPECT_EQ(d.shard_reader, 2);
  m.Leave("a", 1);
  const Member& e = m.Join("e", 2);
  EXPECT_EQ(e.shard_index, 0);
  EXPECT_EQ(e.shard_reader, 0) << "a's reader number is free again";
  EXPECT_EQ(m.Join("c", 3).shard_reader, 1) << "a member that joins again keeps its free number";
  EXPECT_EQ(m.Join("b", 3).shard_reader, 0) << "alone on its shard";
}

// A lost member may come back with its reader number (its process kept it): nobody takes it meanwhile. A worker
// rejoining a restarted coordinator asks for its number back (JoinRequest.shard_reader_hint).
TEST(MembershipTest, ALostReadersNumberIsKeptForItAndARestartedCoordinatorTakesTheHint) {
  Membership m(1);
  m.Join("a", 0);
  EXPECT_EQ(m.Join("b", 0).shard_reader, 1);
  m.Touch("a", 20);
  EXPECT_EQ(m.ExpireLeases(20, 10), (Ids{"b"}));
  EXPECT_EQ(m.Join("c", 21).shard_reader, 2) << "b's 1 is kept for it";
  EXPECT_EQ(m.Join("b", 22).shard_reader, 1) << "b comes back with its number";
  m.Leave("c", 23);
  EXPECT_EQ(m.Join("d", 24).shard_reader, 2) << "a member that left frees its number";

  Membership restarted(1);
  EXPECT_EQ(restarted.Join("b", 0, 0, 1).shard_reader, 1);
  EXPECT_EQ(restarted.Join("a", 0, 0, 0).shard_reader, 0);
  EXPECT_EQ(restarted.Join("d", 0, 0, 1).shard_reader, 2) << "a hint that is taken: the lowest free number";
}

TEST(MembershipTest, StateNames) {
  EXPECT_STREQ(MemberStateName(MemberState::kActive), "active");
  EXPECT_STREQ(MemberStateName(MemberState::kLost), "lost");
  EXPECT_STREQ(MemberStateName(MemberState::kLeft), "left");
}

TEST(MembershipTest, OnlyTheMostRecentlyGoneAreRememberedBeyondTheBound) {
  Membership m(2, /*max_inactive=*/3);
  for (int i = 0; i < 10; ++i) {
    const std::string id = "w" + std::to_string(i);
    m.Join(id, i);
    m.Leave(id, i + 0.5);
  }
  m.Join("active", 20);
  EXPECT_EQ(m.members().size(), 4u) << "3 gone + 1 active";
  EXPECT_EQ(m.gone_count(), 3u);
  EXPECT_EQ(m.forgotten(), 7);
  std::vector<std::string> gone;
  for (const Member* g : m.RecentlyGone(10)) gone.push_back(g->id);
  EXPECT_EQ(gone, (Ids{"w9", "w8", "w7"})) << "newest first; the longest gone were forgotten";
  EXPECT_EQ(m.RecentlyGone(2).size(), 2u);
  EXPECT_EQ(m.active_count(), 1u);
  // A forgotten member may join again as a new member; lost members count against the bound too.
  EXPECT_EQ(m.Join("w0", 30).state, MemberState::kActive);
  EXPECT_EQ(m.ExpireLeases(100, 10).size(), 2u);  // active and w0 lost
  EXPECT_EQ(m.gone_count(), 3u);
  EXPECT_EQ(m.forgotten(), 9);
  gone.clear();
  for (const Member* g : m.RecentlyGone(10)) gone.push_back(g->id);
  EXPECT_EQ(gone, (Ids{"active", "w0", "w9"})) << "same time: by id";
}

}  // namespace
}  // namespace diloco
