// Worker: one worker process (or the leader, rank 0, of a worker cluster) and its life in named phases.
// Run = SetUp (the model's names and fingerprint, the CoordinatorSession and its Join, the trainer, the LocalState,
// the parameter buffers), then per round: PullAll (all of theta, at the start or after the run went on without it),
// Train (H inner steps), Pack (the pseudo-gradient of the round's fragment), ExchangeRound (push until counted, pull
// the fragment's new global value; with comm.overlap_steps the next round's first steps train meanwhile), Apply (merge
// it, or keep the local parameters after a late push); then ShutDown (stop the followers, Leave). Its parts:
// CoordinatorSession (worker/coordinator_session.h: the client and what to do on every status code, as
// worker/protocol_decision.h decides), LocalState (worker/local_state.h: the resumable state and the error feedback),
// HeartbeatThread (worker/heartbeat_thread.h), InnerTrainer (worker/trainer.h), ClusterLeader (the followers).
// Thread-safety: Run is called once, on one thread (main). The threads and what each may touch (the tag on each
// member below): main: everything tagged [main]; exchange (comm.overlap_steps; else main does it): the session and
// the pulled fragment's buffer, fragment_theta_[f], which main leaves alone until it has joined the exchange;
// heartbeat: the session's client and the flags. [any] members are atomics or read-only after SetUp.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "proto/fragment_plan.h"
#include "proto/named_tensors.h"
#include "worker/attack.h"
#include "worker/cluster.h"
#include "worker/cluster_protocol.h"
#include "worker/coordinator_session.h"
#include "worker/heartbeat_thread.h"
#include "worker/local_state.h"
#include "worker/part_exchange.h"
#include "worker/protocol_decision.h"
#include "worker/round_result.h"
#include "worker/run_flags.h"
#include "worker/trainer.h"
#include "worker/worker_options.h"

namespace diloco {

class Worker {
 public:
  // `cluster`: null for a one-process worker; else this process is its leader (rank 0).
  Worker(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop, WorkerCluster* cluster);

  // The whole life. OK when the run is complete or the worker was asked to go (a signal, an operator's drain); else
  // the error, with its exit code (worker/worker_options.h).
  absl::Status Run(const TokenCache& cache);

 private:
  // --- phases (worker.cc) ---
  // The model's names and fingerprint, the session and its Join, then SetUpTrainer.
  absl::Status SetUp(const TokenCache& cache);
  // The trainer (of `model`), the cluster's shard, the local state and the buffers.
  absl::Status SetUpTrainer(const TokenCache& cache, LanguageModelPtr model);
  // The rounds, from the first pull until the run is complete or the worker must stop.
  void RunRounds();
  // Pulls all of theta into theta_ and loads it (unless reuse_local); sets *round. False: stop.
  absl::Status SetUpParts();  // comm.cluster_parts: parts_, part_leader_
  bool PullAll(int64_t* round);
  // Trains the rest of this round's H steps (after those carried over from the overlap).
  StepStats Train(int64_t round);
  // Whether this round's training stayed finite (its loss and the parameters). If not, says so in one line and
  // resets the inner optimizer's moments (the caller pulls the global model again and goes on: issue 32 item 4).
  bool TrainingStayedFinite(int64_t round, const StepStats& stats);
  // The L2 norm of `delta` as the coordinator will decode it (comm.codec's rounding): PushHeader.claimed_norm.
  double PushedNorm(const NamedTensors& delta) const;
  // The pseudo-gradient of fragment f, error-compensated, with the round's report; logs the round.
  RoundResult Pack(int64_t round, int f, const StepStats& stats);
  // Push and pull of the fragment, overlapped with tau steps of the next round (into carried_) when tau > 0.
  std::optional<PullResult> ExchangeRound(int64_t round, int f, const RoundResult& result);
  // After the push of `round` (1-based) counted: the local state of this process and of every follower.
  void SaveLocalState(int64_t round);
  // Merges the pulled fragment f into the local parameters, or keeps them (late_policy reuse_local).
  void Apply(int f);
  // Logs the run's figures, stops the heartbeat thread and leaves. Returns Run's result.
  absl::Status ShutDown(double started);
  // The inner loop of the leader: with a cluster, the followers are told to do the same first.
  StepStats TrainSteps(int64_t first_step, int64_t n);
  int ClusterSize() const { return cluster_ ? cluster_->size() : 1; }
  // Why the worker stopped: its own failure (the cluster), else the session's.
  absl::Status Outcome() const { return failure_.ok() ? session_->failure() : failure_; }

  const Config& config_;                         // [any] read-only
  const WorkerOptions& options_;                 // [any] read-only
  RunFlags flags_;                               // [any] atomics
  WorkerCluster* const cluster_;                 // [main] null for a one-process worker
  std::unique_ptr<ClusterLeader> leader_;        // [main] set with cluster_
  bool followers_left_ = false;                  // [main] the cluster stopped together (no StopCommand to send)
  bool rank_stopped_ = false;                    // [main] ... because another rank wished it (a signal to it)
  std::unique_ptr<CoordinatorSession> session_;  // [exchange] (see above; set in SetUp)
  std::unique_ptr<InnerTrainer> trainer_;        // [main]
  std::unique_ptr<LocalState> local_;            // [main]
  std::unique_ptr<Attacker> attacker_;           // [main] test-only --attack (worker/attack.h); null without it
  AttackSpec step_fault_;                        // [main] test-only --attack nan-step:N / throw-step:N
  // comm.cluster_parts: this rank's slice (snapshot, pseudo-gradient, residual) and the driving of the others' parts;
  // then theta_ holds nothing between full pulls (every rank keeps its slice of theta in parts_).
  std::unique_ptr<PartExchange> parts_;      // [main]; [exchange] inside Exchange
  std::unique_ptr<PartLeader> part_leader_;  // [main]; [exchange] inside Exchange
  // Streaming DiLoCo: round r syncs fragment r mod P after S = H / P inner steps. [any] read-only after SetUp.
  FragmentPlan plan_;
  // theta_: the global value of every tensor as last received (what pseudo-gradients are computed against);
  // fragment_theta_[p]: the same tensors of fragment p (views of theta_), the destination of a fragment pull.
  NamedTensors theta_;                          // [main]; fragment_theta_[f] [exchange] while an exchange is in flight
  std::vector<NamedTensors> fragment_theta_;    // [main] (the vector; its tensors as theta_'s)
  StepStats carried_;                           // [main] inner steps already trained toward the next push (the overlap)
  int64_t assigned_steps_ = 0;                  // [main] H from the last pull (inner.adaptive_steps); 0 = inner.steps
  UncountedStreak uncounted_;                   // [main] rounds in a row whose push did not count
  int non_finite_rounds_ = 0;                   // [main] rounds in a row whose training turned non-finite
  bool saved_at_count_ = false;                 // [main] this round's state was saved when its push counted
  double compute_seconds_ = 0;                  // [main] inner steps, less the cluster's all-reduce waits
  absl::Status failure_;                        // [main] the cluster failed (the session's failures are its own)
  std::unique_ptr<HeartbeatThread> heartbeat_;  // [main] last: stopped before the session it uses goes
};

}  // namespace diloco
