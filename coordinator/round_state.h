// RoundState: the bookkeeping of the open round on the coordinator: which pushes are counted (pushed), which push
// streams are open (streaming) and which of those already have chunks in the sums (partial), the contributors of the
// round being stepped (closing), the aggregation epoch, and the phase with its reason. PushTicket: one push in flight.
// The decisions over this state live in round_policy.h; the tensors (accumulator, theta) stay in the core.
// Not thread-safe: a plain value that CoordinatorCore guards with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proto/round_phase.h"

namespace diloco {

struct MomentumAxis;  // aggregation_rule.h

// One push in flight: created by CoordinatorCore::BeginPush, passed to FoldChunk and CommitPush/AbortPush.
struct PushTicket {
  std::string worker_id;
  int64_t round = 0;  // the open round (version) the push was admitted to
  int64_t base = 0;   // the round it was computed against (its header's): async pushes may be older than `round`
  int fragment = 0;   // round mod comm.fragments
  int64_t epoch = 0;
  int64_t stream = 0;  // RoundState's serial of this push stream: a stream cut as stalled is no longer current
  double weight = 0;
  int64_t tokens = 0;
  int64_t inner_steps = 0;
  double loss = 0;
  double seconds = 0;
  double data_epochs = 0;  // the worker's passes over its shard so far
  int64_t bytes = 0;
  double squared_norm = 0;   // sum of the squares of its folded values (float64), aggregation_rule.h
  double claimed_norm = -1;  // outer.aggregation clip: the header's claimed_norm (checked at the end); -1: mean
  double fold_scale = 1;     // outer.aggregation clip: chunks fold with weight x fold_scale (ClipGate::Scale)
  double momentum_dot = 0;   // outer.momentum_bound: its values . the outer momentum (float64 sums, before any scale)
  std::shared_ptr<const MomentumAxis> momentum;  // ... that momentum, as the push was admitted (null: not watched)
  uint64_t payload_hash = 0;                     // ChainHash of its folded chunks in stream order (aggregation_rule.h)
  bool folded_any = false;
  bool finished = false;
  // A push in parts (push_parts.h): this stream is part `part` of `parts` (> 1), of the assembly `generation`; its
  // stream is keyed `stream_key` (worker id + "#" + part) in RoundState. parts 0: a push in one stream, keyed by id.
  int part = 0;
  int parts = 0;
  int64_t generation = 0;
  std::string stream_key;
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
  bool IsStreaming(const std::string& id) const { return streams_.count(id) != 0; }
  size_t streaming_count() const { return streams_.size(); }
  size_t partial_count() const;

  // A push stream opens at `now`; returns its serial (PushTicket::stream).
  int64_t StartStream(const std::string& id, double now);
  // Whether `serial` is still the open stream of `id` (not ended, not cut).
  bool IsCurrent(const std::string& id, int64_t serial) const;
  void MarkFolded(const std::string& id, double now);     // some of its chunks are in the sums; it made progress
  void EndStream(const std::string& id, int64_t serial);  // committed or broken off (no-op if no longer current)
  // Open streams that stalled: no progress (opened or folded a chunk) for stall_s, or open for longer than max_age_s.
  std::vector<std::string> StalledStreams(double now, double stall_s, double max_age_s) const;
  // Ends `id`'s stream from the coordinator's side; returns whether it had chunks in the sums.
  bool CutStream(const std::string& id);
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
  struct OpenStream {
    int64_t serial = 0;
    double opened_at = 0;
    double progress_at = 0;  // opened or last chunk folded
    bool folded = false;     // some of its chunks are in the sums (of this epoch): blocks closing
  };
  Pushes pushed_;                              // pushes counted in the open round
  std::map<std::string, OpenStream> streams_;  // workers with a push stream open (one at a time each)
  std::set<std::string> closing_;              // contributors of the round being stepped (heartbeats: pushed)
  int64_t next_stream_ = 0;
  int64_t epoch_ = 0;
  double opened_at_ = 0;
  RoundPhase phase_ = RoundPhase::kTraining;
  std::string phase_reason_;
};

}  // namespace diloco
