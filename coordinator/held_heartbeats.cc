// HeldHeartbeats (coordinator/held_heartbeats.h): which held heartbeats are due, and the one-per-worker rule.
#include "coordinator/held_heartbeats.h"

#include <utility>

namespace diloco {
namespace {

bool SameAnswer(const HeartbeatReply& a, const HeartbeatReply& b) {
  return a.round() == b.round() && a.pushed() == b.pushed() && a.run_complete() == b.run_complete() &&
         a.drain() == b.drain() && a.quarantined_until_round() == b.quarantined_until_round() &&
         a.last_applied_base() == b.last_applied_base();
}

}  // namespace

bool Holdable(const HeartbeatReply& reply, int64_t round, bool async) {
  const bool waits_for_it = async ? reply.round() >= round : reply.round() == round;
  return waits_for_it && reply.pushed() && !reply.run_complete() && !reply.drain() &&
         reply.quarantined_until_round() <= reply.round();
}

std::optional<HeldHeartbeats::Held> HeldHeartbeats::Hold(Held held) {
  std::optional<Held> replaced;
  for (Held& h : held_) {
    if (h.worker_id != held.worker_id) continue;
    replaced = std::move(h);
    h = std::move(held);
    return replaced;
  }
  held_.push_back(std::move(held));
  return replaced;
}

std::vector<HeldHeartbeats::Held> HeldHeartbeats::Due(double now,
                                                      const std::function<HeartbeatReply(const std::string&)>& current,
                                                      bool all) {
  std::vector<Held> due, kept;
  for (Held& h : held_) {
    HeartbeatReply answer = current(h.worker_id);
    if (all || now >= h.deadline || !SameAnswer(answer, h.reply)) {
      h.reply = std::move(answer);
      due.push_back(std::move(h));
    } else {
      kept.push_back(std::move(h));
    }
  }
  held_ = std::move(kept);
  return due;
}

}  // namespace diloco
