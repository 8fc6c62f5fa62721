// RoundState: the bookkeeping of the open round on the coordinator: which pushes are counted (pushed), which push
// streams are open (streaming) and which of those already have chunks in the sums (partial), the contributors of the
// round being stepped (closing), the aggregation epoch, and the phase with its reason. PushTicket: one push in flight.
// The decisions over this state live in round_policy.h; the tensors (accumulator, theta) stay in the core.
// Not thread-safe: a plain value that CoordinatorCore guards with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "proto/round_phase.h"

namespace diloco {

// One push in flight: created by CoordinatorCore::BeginPush, passed to FoldChunk and CommitPush/AbortPush.
struct PushTicket {
  std::string worker_id;
  int64_t round = 0;
  int fragment = 0;  // round mod comm.fragments
  int64_t epoch = 0;
  double weight = 0;
  int64_t tokens = 0;
  int64_t inner_steps = 0;
  double loss = 0;
  double seconds = 0;
  double data_epochs = 0;  // the worker's passes over its shard so far
  int64_t bytes = 0;
  bool folded_any = false;
  bool finished = false;
};

class RoundState {
 public:
  using Pushes = std::map<std::string, PushTicket>;  // by worker id

  RoundPhase phase() const { return phase_; }
  void set_phase(RoundPhase phase) { phase_ = phase; }
  const std::string& phase_reason() const { return phase_reason_; }
  void set_phase_reason(std::string reason) { phase_reason_ = std::move(reason); }
  // Bumped whenever the open round's aggregation restarts or the round closes: a ticket of an older epoch is stale.
  int64_t epoch() const { return epoch_; }
  double opened_at() const { return opened_at_; }
  void set_opened_at(double t) { opened_at_ = t; }

  const Pushes& pushed() const { return pushed_; }
  std::set<std::string> PushedIds() const;
  bool HasPushed(const std::string& id) const { return pushed_.count(id) != 0; }
  // Counted in the open round or among the contributors being stepped (a heartbeat's `pushed`).
  bool CountsAsPushed(const std::string& id) const { return HasPushed(id) || closing_.count(id) != 0; }
  bool IsStreaming(const std::string& id) const { return streaming_.count(id) != 0; }
  size_t streaming_count() const { return streaming_.size(); }
  size_t partial_count() const { return partial_.size(); }

  void StartStream(const std::string& id) { streaming_.insert(id); }
  void MarkFolded(const std::string& id) { partial_.insert(id); }  // some of its chunks are in the sums
  void EndStream(const std::string& id);                           // committed or broken off
  void Count(const PushTicket& ticket) { pushed_[ticket.worker_id] = ticket; }
  // A push broke off after folding: every counted push and every part-folded one must start over (new epoch).
  // Returns how many counted pushes were dropped.
  size_t RestartAggregation();
  // Closing: the counted pushes leave the open round and become the contributors being stepped (phase stepping,
  // new epoch).
  Pushes TakeForClose();
  // The step is over (applied or discarded): no contributors any more, the phase becomes `next`.
  void EndClose(RoundPhase next);

 private:
  Pushes pushed_;                    // pushes counted in the open round
  std::set<std::string> streaming_;  // workers with a push stream open (one at a time each)
  std::set<std::string> partial_;    // ... of which some chunks are already in the sums: blocks closing
  std::set<std::string> closing_;    // contributors of the round being stepped (heartbeats: pushed)
  int64_t epoch_ = 0;
  double opened_at_ = 0;
  RoundPhase phase_ = RoundPhase::kTraining;
  std::string phase_reason_;
};

}  // namespace diloco
