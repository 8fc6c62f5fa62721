#include "coordinator/round_state.h"

namespace diloco {

std::set<std::string> RoundState::PushedIds() const {
  std::set<std::string> ids;
  for (const auto& [id, ticket] : pushed_) ids.insert(id);
  return ids;
}

size_t RoundState::partial_count() const {
  size_t n = 0;
  for (const auto& [id, s] : streams_) n += s.folded ? 1 : 0;
  return n;
}

int64_t RoundState::StartStream(const std::string& id, double now) {
  OpenStream& s = streams_[id];
  s = OpenStream{++next_stream_, now, now, false};
  return s.serial;
}

bool RoundState::IsCurrent(const std::string& id, int64_t serial) const {
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.serial == serial;
}

void RoundState::MarkFolded(const std::string& id, double now) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  it->second.folded = true;
  it->second.progress_at = now;
}

void RoundState::EndStream(const std::string& id, int64_t serial) {
  if (IsCurrent(id, serial)) streams_.erase(id);
}

std::vector<std::string> RoundState::StalledStreams(double now, double stall_s, double max_age_s) const {
  std::vector<std::string> stalled;
  for (const auto& [id, s] : streams_) {
    if (now - s.progress_at > stall_s || now - s.opened_at > max_age_s) stalled.push_back(id);
  }
  return stalled;
}

bool RoundState::CutStream(const std::string& id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return false;
  const bool folded = it->second.folded;
  streams_.erase(it);
  return folded;
}

size_t RoundState::RestartAggregation() {
  // Every other push in flight was folded under the old epoch and must start over.
  for (auto& [id, s] : streams_) s.folded = false;
  ++epoch_;
  const size_t dropped = pushed_.size();
  pushed_.clear();
  return dropped;
}

RoundState::Pushes RoundState::TakeForClose() {
  phase_ = RoundPhase::kStepping;
  Pushes contributors;
  contributors.swap(pushed_);
  for (const auto& [id, push] : contributors) closing_.insert(id);
  ++epoch_;
  return contributors;
}

void RoundState::EndClose(RoundPhase next) {
  closing_.clear();
  phase_ = next;
}

}  // namespace diloco
