// The protocol between the ranks of one worker cluster (workers.cluster_size > 1, worker/cluster.h): rank 0, the
// leader, joins and heartbeats (and, without comm.cluster_parts, alone pushes and pulls) and tells the followers what
// to do; this file holds both sides.
//   ShardCommand  after the leader's Join: the worker's shard (each rank reads its part of it: MakeRankLayout)
//   LoadCommand   then a Broadcast of all of theta (parameter order): every rank loads it
//   TrainCommand  train `steps` inner steps from global inner step `first_step` (gradients averaged every step)
//   MergeCommand  then a Broadcast of fragment `fragment`'s tensors: every rank merges them with `alpha`
//   StopCommand   the follower leaves with the leader's exit code (0 after a run; else the code of the leader's failed
//                 Join or of its failure, with its line)
//   SaveCommand   after the leader saved its local state for `round` (the round's push counted): every rank saves its
//                 own (worker/local_state.h), so that a cluster restarted with its id resumes every rank's state
//   PushPartCommand  comm.cluster_parts (worker/part_exchange.h): push this rank's part of round `round` with the
//                 header the leader put in the store under exchange `seq`, and put the outcome there
//   PullPartCommand  pull this rank's slice of theta into its snapshot, and put the outcome in the store (`seq`)
//   GatherCommand then an all-gather of the ranks' snapshots into every rank's parameters
//   ResetMomentsCommand  the round's training turned non-finite: every rank starts its AdamW moments over
//   SettleCommand comm.cluster_parts with error feedback: whether the member's push counted; each rank keeps its
//                 slice's new residual, or takes back the one from before the push (PartExchange::Settle)
// On the wire a command is 4 int64 words [kind, w1, w2, w3] set in the cluster's store (WorkerCluster::SendWords and
// ReceiveWords: a follower may wait for the next one for a whole round, longer than any collective may take):
//   kind 1 shard: w1 shard_index, w2 shard_count, w3 shard_reader; kind 2 load; kind 3 train: w1 first_step, w2 steps;
//   kind 4 merge: w1 fragment, w3 the bits of alpha (IEEE double); kind 5 stop: w1 exit code; kind 6 save: w1 round;
//   kind 7 push part: w1 round, w2 seq; kind 8 pull part: w2 seq; kind 9 gather; kind 10 reset moments; kind 11 settle:
//   w1 1 (counted) or 0. Unused words are 0. The store keys of a part exchange (values set with WorkerCluster::Put,
//   taken once): "hdr/<seq>/<rank>" the serialized PushHeader for that rank, "out/<seq>/<rank>" that rank's outcome
//   (worker/part_exchange.h EncodePartOutcome).
// Thread-safety: ClusterLeader is used by the leader's inner-loop thread only; RunClusterFollower once per process.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <variant>

#include "absl/status/status.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "worker/cluster.h"
#include "worker/trainer.h"
#include "worker/worker_options.h"

namespace diloco {

struct ShardCommand {
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  int64_t shard_reader = 0;  // JoinReply.shard_reader: seeds the ranks' samplers when members share a shard
};
struct LoadCommand {};
struct TrainCommand {
  int64_t first_step = 0;  // global inner step (the LR schedule's position)
  int64_t steps = 0;
};
struct MergeCommand {
  int64_t fragment = 0;
  double alpha = 0;  // comm.merge_alpha (0: replace)
};
struct StopCommand {
  int64_t exit_code = 0;  // the leader's (worker/worker_options.h WorkerExit): 0 after a run or a signal
};
struct SaveCommand {
  int64_t round = 0;  // 1-based: the round whose push counted (LocalState::Save)
};
struct PushPartCommand {
  int64_t round = 0;
  int64_t seq = 0;
};
struct PullPartCommand {
  int64_t seq = 0;
};
struct GatherCommand {};
struct ResetMomentsCommand {};
struct SettleCommand {
  bool counted = false;
};
using ClusterCommand =
    std::variant<ShardCommand, LoadCommand, TrainCommand, MergeCommand, StopCommand, SaveCommand, PushPartCommand,
                 PullPartCommand, GatherCommand, ResetMomentsCommand, SettleCommand>;

using CommandWords = std::array<int64_t, 4>;
CommandWords EncodeCommand(const ClusterCommand& command);
// Throws std::runtime_error on an unknown kind.
ClusterCommand DecodeCommand(const CommandWords& words);

// The leader's side: each method tells the followers and sends what the command needs; the leader then does the
// same itself (InnerTrainer). Each command returns once every follower has taken it, so its collectives start with
// every rank at them. Throws on a dead rank (as WorkerCluster does).
class ClusterLeader {
 public:
  explicit ClusterLeader(WorkerCluster& cluster) : cluster_(cluster) {}
  // Waited for as long as the followers heartbeat: each acknowledges it once it has built its trainer.
  void Shard(int64_t shard_index, int64_t shard_count, int64_t shard_reader) {
    cluster_.SendWords(EncodeCommand(ShardCommand{shard_index, shard_count, shard_reader}), /*wait_while_heard=*/true);
  }
  void Load(const NamedTensors& theta);  // theta: all of the parameters (the leader's loaded ones, on its device)
  void Train(int64_t first_step, int64_t steps) { Send(TrainCommand{first_step, steps}); }
  void Merge(int fragment, double alpha, const NamedTensors& incoming);  // incoming: the fragment's tensors
  // exit_code != 0 (the leader's Join failed, or it leaves the run failed: its training diverged every round):
  // `reason`, its error line, goes to the followers through the store, so that each says it and exits with the same
  // code (under diloco-launch the first rank to exit is the one whose line is shown).
  void Stop(int64_t exit_code = 0, const std::string& reason = "");
  void Save(int64_t round) { Send(SaveCommand{round}); }
  void ResetMoments() { Send(ResetMomentsCommand{}); }
  // comm.cluster_parts: the commands only (PartLeader, worker/part_exchange.h, does the rest).
  void Send(const ClusterCommand& command);

 private:
  WorkerCluster& cluster_;
};

// comm.cluster_parts: what a follower does on the part commands and after a load (worker/part_exchange.h makes it;
// this library has no coordinator client). Made once the follower's trainer and local state exist (the state keeps
// the rank's slice residual: LocalState::KeepSliceResidual).
class FollowerParts {
 public:
  virtual ~FollowerParts() = default;
  virtual void Loaded() = 0;  // after LoadCommand's broadcast: the parameters hold theta
  virtual void Push(const PushPartCommand& command) = 0;
  virtual void Pull(const PullPartCommand& command) = 0;
  virtual void Gather() = 0;
  virtual void Settle(bool counted) = 0;  // SettleCommand
};
class LocalState;
using FollowerPartsFactory =
    std::function<absl::StatusOr<std::unique_ptr<FollowerParts>>(InnerTrainer& trainer, LocalState& local)>;

// The life of a rank > 0: waits (as long as the leader lives) for the leader's commands and does them until
// StopCommand (the leader's exit code and line: 0 after a run; before the ShardCommand, its failed Join's; after,
// its failure's), a training abandoned by the cluster's stop wish (OK: exit 0), or a dead leader or rank (exit 5,
// kWorkerClusterFailed), as a status carrying its exit code (worker/worker_options.h).
// With comm.cluster_parts `parts` makes the rank's side of the part commands.
absl::Status RunClusterFollower(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                                WorkerCluster& cluster, const std::atomic<bool>& stop,
                                const FollowerPartsFactory& parts = {});

}  // namespace diloco
