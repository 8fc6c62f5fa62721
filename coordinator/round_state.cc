#include "coordinator/round_state.h"

namespace diloco {

std::set<std::string> RoundState::PushedIds() const {
  std::set<std::string> ids;
  for (const auto& [id, ticket] : pushed_) ids.insert(id);
  return ids;
}

void RoundState::EndStream(const std::string& id) {
  streaming_.erase(id);
  partial_.erase(id);
}

size_t RoundState::RestartAggregation() {
  partial_.clear();  // every other push in flight was folded under the old epoch and must start over
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
