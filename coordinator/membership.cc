#include "coordinator/membership.h"

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

const Member& Membership::Join(const std::string& id, double now, int shard_hint) {
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
    it = members_.emplace(id, m).first;
  }
  // Keep the shard this member had (or asked for) if nobody else holds it; else take the lowest free one.
  int& shard = it->second.shard_index;
  if (shard < 0 || shard >= shard_count_ || taken.count(shard) != 0) {
    shard = 0;
    while (taken.count(shard) != 0 && shard < shard_count_) ++shard;
    shard %= shard_count_;  // more members than shards: shards are shared
  }
  it->second.state = MemberState::kActive;
  it->second.last_seen = now;
  it->second.drain_requested = false;
  return it->second;
}

bool Membership::Touch(const std::string& id, double now) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.state != MemberState::kActive) return false;
  it->second.last_seen = now;
  return true;
}

void Membership::Leave(const std::string& id) {
  auto it = members_.find(id);
  if (it != members_.end()) it->second.state = MemberState::kLeft;
}

std::vector<std::string> Membership::ExpireLeases(double now, double lease_s) {
  std::vector<std::string> lost;
  for (auto& [id, m] : members_) {
    if (m.state == MemberState::kActive && now - m.last_seen > lease_s) {
      m.state = MemberState::kLost;
      lost.push_back(id);
    }
  }
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

Member* Membership::Find(const std::string& id) {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

}  // namespace diloco
