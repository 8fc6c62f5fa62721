// Membership: who belongs to the run and in what state, as pure logic over an injected clock (seconds as double).
// A member is `active` from Join until it leaves (`left`) or stays silent longer than the lease (`lost`); a lost or
// left member that joins again with the same id becomes active again and keeps its shard. Each active member owns
// one of `shard_count` disjoint data shards: the one it had or asked for if free, else the lowest free index
// (with more active members than shards, they wrap around and share: each member reading a shard has its own
// `shard_reader` number, the one it had or asked for if no other active or lost reader of that shard holds it (a lost
// one may come back with it), else the lowest free one; the worker seeds its window sampler with it, so sharers draw
// different windows).
// Bounded: at most `max_inactive` members that left or were lost are remembered (the longest gone are forgotten first
// and only counted), so ids that come and go cannot grow memory or the status reply without bound; the number of
// active members is bounded by the coordinator (coordinator.max_members, checked before Join).
// Not thread-safe: the coordinator calls it under its own mutex.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "proto/checkpoint.h"

namespace diloco {

enum class MemberState { kActive, kLost, kLeft };
const char* MemberStateName(MemberState s);

struct Member {
  std::string id;
  MemberState state = MemberState::kActive;
  double joined_at = 0;
  double last_seen = 0;
  int shard_index = 0;
  int shard_reader = 0;  // among the active members reading shard_index: 0 alone or first (header comment)
  int64_t rounds_contributed = 0;
  int64_t tokens = 0;
  double last_loss = 0;
  double last_tokens_per_s = 0;
  int64_t bytes_pushed = 0;
  int64_t bytes_pulled = 0;
  bool drain_requested = false;  // an operator asked it to leave
  int cluster_size = 1;          // processes of this worker (workers.cluster_size), as told at Join
  double steps_per_s = 0;        // inner steps per second of its last committed push (0: not measured yet)
  int64_t inner_steps = 0;       // its H for the next round (inner.adaptive_steps); 0 = inner.steps
  double data_epochs = 0;        // passes over its data shard, as of its last counted push
  double state_since = 0;        // when it last became active, left or was lost
  int64_t broken_pushes = 0;     // its pushes that broke off after folding chunks (round_policy.h "Broken pushes")
  int64_t strikes = 0;           // ... since its last counted push
  int64_t quarantined_until_round = 0;  // its pushes are refused while fewer outer steps than this are done
  std::string quarantine_reason;        // why, for the refusal's message ("3 broken pushes in a row", ...)
  double last_push_norm = 0;            // robust aggregation (issue 32), as of its last counted push
  double last_clip_scale = 1;           // outer.aggregation clip's factor for that push
  int64_t clipped_in_a_row = 0;         // consecutive committed rounds its push lay far beyond clip, bound or trim
  bool suspect = false;                 // clipped_in_a_row reached outer.flag_rounds (outer.flag_margin)
  double momentum_cosine = 0;           // outer.momentum_bound: its last counted push's cosine with the outer
  bool momentum_bounded = false;        // momentum, whether its component along it was bounded (clip), and whether
  bool momentum_far = false;            // it lay far beyond the bound (outer.flag_margin; every robust rule)
  double last_trimmed_share = 0;        // trimmed_mean: the share of its last push's coordinates the trim dropped
  int64_t pushes_in_parts = 0;          // counted pushes that came in parts (coordinator_parts.cc)
  int64_t duplicate_pushes = 0;         // pushes refused as byte-identical copies or replays (CheckDuplicate)
  // The newest round (async: version) one of its pushes that a committed outer step counted was computed against
  // (-1: none). A push computed against it or an older one is a resend of a counted push (its reply was lost): it is
  // answered ALREADY_EXISTS, never counted twice or called late (CheckPushHeader).
  int64_t last_applied_base = -1;
};

class Membership {
 public:
  static constexpr size_t kDefaultMaxInactive = 256;
  explicit Membership(int shard_count, size_t max_inactive = kDefaultMaxInactive)
      : shard_count_(shard_count), max_inactive_(max_inactive) {}

  // Adds or reactivates `id`; returns the member (with its shard index). A new member gets `shard_hint` if that
  // shard is valid and free (a worker rejoining a restarted coordinator keeps its data), else the lowest free one.
  // `reader_hint` >= 0: the shard_reader it had (a worker rejoining a restarted coordinator), kept if free.
  const Member& Join(const std::string& id, double now, int shard_hint = -1, int reader_hint = -1);
  // A member of the run before the coordinator restarted (its checkpoint's record): active from `now` (its lease runs
  // from the restart; a worker that lives heartbeats on as before) or, with `active` false, lost (it must Join again,
  // and keeps its shard and record when it does). An id already known is left as it is.
  void Restore(const MemberRecord& record, double now, bool active);
  // Refreshes the lease. Returns false if `id` is unknown or not active (it must Join again).
  bool Touch(const std::string& id, double now);
  void Leave(const std::string& id, double now);
  // Marks active members silent for more than lease_s as lost; returns their ids.
  std::vector<std::string> ExpireLeases(double now, double lease_s);

  bool IsActive(const std::string& id) const;
  std::vector<std::string> ActiveIds() const;
  size_t active_count() const;
  // Members that left or were lost, the most recently gone first, at most `limit` of them.
  std::vector<const Member*> RecentlyGone(size_t limit) const;
  size_t gone_count() const { return members_.size() - active_count(); }  // remembered ones
  int64_t forgotten() const { return forgotten_; }  // left or lost members dropped beyond max_inactive
  Member* Find(const std::string& id);
  const Member* Find(const std::string& id) const;
  const std::map<std::string, Member>& members() const { return members_; }
  int shard_count() const { return shard_count_; }

 private:
  void ForgetBeyondBound();

  int shard_count_;
  size_t max_inactive_;
  int64_t forgotten_ = 0;
  std::map<std::string, Member> members_;
};

}  // namespace diloco
