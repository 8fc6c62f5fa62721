// PartExchange: one rank's side of a worker cluster's pushes and pulls in parts (comm.cluster_parts;
// proto/PROTOCOL.md "Push and pull in parts"). Every rank of the cluster has its own connection to the coordinator
// (the member's worker id, no Join of its own) and owns slice r of the model's flat buffer (parameters in parameter
// order laid end to end; proto/slice_plan.h), for which it keeps
//   - the DiLoCo snapshot: its slice of theta_t, the global parameters the pseudo-gradient is taken against (no rank
//     holds a full copy of theta: the snapshot is 4 / n bytes per parameter);
//   - its slice of the round's pseudo-gradient, delta = snapshot - parameters (plus, with error feedback, its slice
//     of the residual: comm.error_feedback with int8/int4, always with topk; saved in the rank's state file by
//     worker/local_state.h, restored at set-up by RestoreResidual);
// and pushes that slice as part r of n, pulls its slice of theta_{t+1} into the snapshot, and all-gathers the
// snapshots into the model's parameters: in place in the inner optimizer's padded parameter buffer when the optimizer
// is sharded with the same slices (workers.sharding with comm.chunk_bytes >= the smallest chunk), else through a
// temporary buffer of the whole model. Rank 0 drives the others through the cluster's commands
// (worker/cluster_protocol.h: push part, pull part, gather) and folds the ranks' outcomes into one status
// (PartLeader below), which CoordinatorSession then decides on as it does for a one-stream push or pull: any part
// refused, broken or ABORTED means every part is pushed again.
// Thread-safety: none; each rank's inner-loop thread calls it between training calls.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"
#include "proto/named_tensors.h"
#include "proto/slice_plan.h"
#include "proto/tensor_spec.h"
#include "worker/client.h"
#include "worker/cluster_protocol.h"
#include "worker/flat_adamw.h"
#include "worker/round_report.h"
#include "worker/worker_options.h"

namespace diloco {

class PartExchange {
 public:
  // `params`: handles to the model's parameters (any device), in parameter order. The client is made like the
  // session's (security.*, options.coordinator and options.id); an unreadable credential is a config error.
  // `optimizer`: the trainer's inner optimizer, whose padded parameter buffer the gather fills when its slices are
  // this exchange's (else, or null, a temporary).
  static absl::StatusOr<std::unique_ptr<PartExchange>> Open(const Config& config, const WorkerOptions& options,
                                                            const std::string& fingerprint, WorkerCluster& cluster,
                                                            NamedTensors params, const FlatAdamW* optimizer = nullptr);

  const SlicePlan& plan() const { return plan_; }
  FlatRange mine() const { return mine_; }
  const torch::Tensor& snapshot() const { return snapshot_; }
  // Error feedback's slice of the residual after the last push (undefined: none yet, or no error feedback).
  const torch::Tensor& residual() const { return residual_; }
  bool feedback() const { return feedback_; }  // error feedback on (int8/int4 with comm.error_feedback, or topk)
  // A resumed rank's saved residual (worker/local_state.h KeepSliceResidual; undefined: none): taken when this
  // exchange keeps one and it has this rank's slice length, else ignored with a warning.
  void RestoreResidual(const torch::Tensor& saved);
  bool gathers_in_place() const { return padded_.defined(); }  // into the optimizer's buffer (see Open)
  // This rank's slice of the round's pseudo-gradient as the next push sends it (computed once per snapshot).
  const torch::Tensor& PseudoGradientSlice();

  // After a full pull loaded theta into the parameters: this rank's slice of them becomes the snapshot.
  void TakeSnapshot();
  // One attempt at pushing this rank's part for header.meta().round(): `header` is the member's (rank 0's report);
  // part, parts and range are set here. The first attempt after a new snapshot computes the slice's pseudo-gradient
  // (and updates the residual); later attempts (pushing again) send the same values.
  absl::StatusOr<int64_t> PushMine(const PushHeader& header);
  // One attempt at pulling this rank's slice of the current theta into the snapshot (-1: the whole model).
  absl::StatusOr<PullResult> PullMine();
  // Collective (every rank): the snapshots all-gathered into the model's parameters, which then hold theta.
  void GatherIntoParameters();
  // Error feedback, after the member's push: counted keeps the residual its pseudo-gradient slice left, else the
  // residual from before it comes back (as ErrorFeedback::Settle). Both are held from the slice's encode until then
  // (one more slice, 4 / n bytes per parameter). Nothing to do without a push since the last Settle.
  void Settle(bool counted);

 private:
  PartExchange(const Config& config, WorkerCluster& cluster, NamedTensors params,
               std::unique_ptr<CoordinatorClient> client);
  // This rank's slice of the parameters, float32 on the CPU (a view of the optimizer's buffer where it can be).
  torch::Tensor SliceOfParameters() const;
  void PrepareDelta();
  void DropDelta();  // the snapshot or the parameters changed: the pseudo-gradient slice is stale
  torch::Tensor RoundTrip(const torch::Tensor& values) const;  // what the coordinator decodes from `values`

  const Config& config_;
  WorkerCluster& cluster_;
  NamedTensors params_;
  torch::Tensor padded_;  // the optimizer's padded parameter buffer when its slices are plan_'s; else undefined
  std::vector<TensorSpec> specs_;
  std::vector<int64_t> starts_;  // flat index of each tensor's first element
  SlicePlan plan_;
  FlatRange mine_;
  std::unique_ptr<CoordinatorClient> client_;
  Codec codec_;
  TopkParams topk_;
  bool feedback_ = false;
  double beta_ = 1.0;
  torch::Tensor snapshot_;           // [mine_.size()] float32 CPU: theta_t's slice
  torch::Tensor delta_;              // the pseudo-gradient slice pushed (compensated); undefined until the first push
  torch::Tensor residual_;           // error feedback's slice
  torch::Tensor previous_residual_;  // ... before the last PrepareDelta, until Settle
  bool unsettled_ = false;           // a PrepareDelta since the last Settle
  bool delta_ready_ = false;
};

// Rank 0's half: tells the other ranks to push (pull) their parts, does its own, and folds every rank's outcome into
// one status: the first refusal that is neither UNAVAILABLE nor ABORTED (the part the coordinator refused, which
// aborted the others), else UNAVAILABLE, else ABORTED, else OK. Pulls whose ranks saw different rounds are
// UNAVAILABLE (pull again). Throws on a dead rank, as every cluster command does.
class PartLeader {
 public:
  PartLeader(const Config& config, WorkerCluster& cluster, ClusterLeader& leader, PartExchange& mine)
      : config_(config), cluster_(cluster), leader_(leader), mine_(mine) {}
  absl::StatusOr<int64_t> Push(int64_t round, const RoundReport& report);
  absl::StatusOr<PullResult> Pull();
  void Gather();              // every rank: GatherIntoParameters
  void Settle(bool counted);  // every rank: PartExchange::Settle

 private:
  const Config& config_;
  WorkerCluster& cluster_;
  ClusterLeader& leader_;
  PartExchange& mine_;
  int64_t seq_ = 0;            // numbers the exchanges (the store keys of their headers and outcomes)
  uint64_t last_attempt_ = 0;  // PushHeader.attempt of the last push: each push (re-push) takes a larger one
};

// A follower's side (worker/cluster_protocol.h FollowerParts) when config.comm.cluster_parts; empty otherwise.
FollowerPartsFactory FollowerPartsOf(const Config& config, const WorkerOptions& options, WorkerCluster& cluster);

// A rank's outcome of one part as it travels through the cluster's store to rank 0.
std::string EncodePartOutcome(const absl::Status& status, const PullResult& result);
absl::Status DecodePartOutcome(const std::string& text, PullResult* result);
// The followers' side of the commands: push (pull) this rank's part for exchange `seq` and report the outcome.
void ServePartPush(WorkerCluster& cluster, PartExchange& exchange, int64_t seq, const Config& config);
void ServePartPull(WorkerCluster& cluster, PartExchange& exchange, int64_t seq);

}  // namespace diloco
