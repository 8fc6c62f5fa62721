#include "coordinator/membership.h"

#include <algorithm>
#include <set>

namespace diloco {

const char* MemberStateName(MemberState s) {
  switch (s) {
    case MemberState::kActive:
      return "active";
    case MemberState::kLost:
      return "lost";
    case MemberState::kLeft:
      return "left";
  }
  return "unknown";
}

const Member& Membership::Join(const std::string& id, double now, int shard_hint, int reader_hint) {
  std::set<int> taken;  // shards of the other active members
  for (const auto& [other_id, m] : members_) {
    if (other_id != id && m.state == MemberState::kActive) taken.insert(m.shard_index);
  }
  auto it = members_.find(id);
  if (it == members_.end()) {
    Member m;
    m.id = id;
    m.joined_at = now;
    m.shard_index = shard_hint;
    m.shard_reader = std::max(reader_hint, 0);
    it = members_.emplace(id, m).first;
  }
  // Keep the shard this member had (or asked for) if nobody else holds it; else take the lowest free one.
  int& shard = it->second.shard_index;
  if (shard < 0 || shard >= shard_count_ || taken.count(shard) != 0) {
    shard = 0;
    while (taken.count(shard) != 0 && shard < shard_count_) ++shard;
    shard %= shard_count_;  // more members than shards: shards are shared
  }
  std::set<int> readers;  // reader numbers of the other members on that shard, active or lost (they may come back)
  for (const auto& [other_id, m] : members_) {
    if (other_id != id && m.state != MemberState::kLeft && m.shard_index == shard) readers.insert(m.shard_reader);
  }
  int& reader = it->second.shard_reader;
  if (readers.count(reader) != 0) {
    reader = 0;
    while (readers.count(reader) != 0) ++reader;
  }
  if (it->second.state != MemberState::kActive || it->second.state_since == 0) it->second.state_since = now;
  it->second.state = MemberState::kActive;
  it->second.last_seen = now;
  it->second.drain_requested = false;
  return it->second;
}

void Membership::Restore(const MemberRecord& record, double now, bool active) {
  if (members_.count(record.id) != 0) return;
  Member m;
  m.id = record.id;
  m.state = active ? MemberState::kActive : MemberState::kLost;
  m.joined_at = m.last_seen = m.state_since = now;
  m.shard_index = record.shard_index >= 0 && record.shard_index < shard_count_ ? record.shard_index : 0;
  m.shard_reader = std::max(record.shard_reader, 0);
  m.cluster_size = std::max(record.cluster_size, 1);
  m.inner_steps = std::max<int64_t>(record.inner_steps, 0);
  m.last_applied_base = record.last_applied_base;
  m.rounds_contributed = std::max<int64_t>(record.rounds_contributed, 0);
  m.tokens = std::max<int64_t>(record.tokens, 0);
  m.bytes_pushed = std::max<int64_t>(record.bytes_pushed, 0);
  members_.emplace(m.id, m);
}

bool Membership::Touch(const std::string& id, double now) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.state != MemberState::kActive) return false;
  it->second.last_seen = now;
  return true;
}

void Membership::Leave(const std::string& id, double now) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  it->second.state = MemberState::kLeft;
  it->second.state_since = now;
  ForgetBeyondBound();
}

std::vector<std::string> Membership::ExpireLeases(double now, double lease_s) {
  std::vector<std::string> lost;
  for (auto& [id, m] : members_) {
    if (m.state == MemberState::kActive && now - m.last_seen > lease_s) {
      m.state = MemberState::kLost;
      m.state_since = now;
      lost.push_back(id);
    }
  }
  if (!lost.empty()) ForgetBeyondBound();
  return lost;
}

bool Membership::IsActive(const std::string& id) const {
  auto it = members_.find(id);
  return it != members_.end() && it->second.state == MemberState::kActive;
}

std::vector<std::string> Membership::ActiveIds() const {
  std::vector<std::string> ids;
  for (const auto& [id, m] : members_) {
    if (m.state == MemberState::kActive) ids.push_back(id);
  }
  return ids;
}

size_t Membership::active_count() const {
  return static_cast<size_t>(std::count_if(members_.begin(), members_.end(),
                                           [](const auto& kv) { return kv.second.state == MemberState::kActive; }));
}

std::vector<const Member*> Membership::RecentlyGone(size_t limit) const {
  std::vector<const Member*> gone;
  for (const auto& [id, m] : members_) {
    if (m.state != MemberState::kActive) gone.push_back(&m);
  }
  std::sort(gone.begin(), gone.end(), [](const Member* a, const Member* b) {
    return a->state_since != b->state_since ? a->state_since > b->state_since : a->id < b->id;
  });
  if (gone.size() > limit) gone.resize(limit);
  return gone;
}

void Membership::ForgetBeyondBound() {
  size_t gone = gone_count();
  if (gone <= max_inactive_) return;
  std::vector<const Member*> order = RecentlyGone(gone);  // most recent first: forget from the back
  std::vector<std::string> forget;
  for (size_t i = max_inactive_; i < order.size(); ++i) forget.push_back(order[i]->id);
  for (const std::string& id : forget) members_.erase(id);
  forgotten_ += static_cast<int64_t>(forget.size());
}

const Member* Membership::Find(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

Member* Membership::Find(const std::string& id) {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

}  // namespace diloco
