// Worker: everything one worker process (or the leader, rank 0, of a worker cluster) holds, and its life in named
// phases. Run = SetUp (client, Join, trainer, parameter buffers), then per round: PullAll (all of theta, at the start
// or after the run went on without it), Train (H inner steps), Pack (the pseudo-gradient of the round's fragment),
// ExchangeRound (push until counted, pull the fragment's new global value; with comm.overlap_steps the next round's
// first steps train meanwhile), Apply (merge it, or keep the local parameters after a late push); then ShutDown
// (stop the followers, Leave). What to do on each gRPC status is decided by worker/protocol_decision.h; this class
// only follows (worker_exchange.cc: Join, Push, Pull and Heartbeat with their retries).
// Thread-safety: Run is called once, on one thread. It starts a heartbeat thread (reads client_, round_, sets drain_
// and quit_) and, with overlap, an exchange thread (touches client_, backoff_, join_, keep_local_, exit_code_ and the
// flags while the inner loop trains; the main thread reads them only after joining it).
#pragma once

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "config/data_cache.h"
#include "proto/codec.h"
#include "proto/diloco.pb.h"
#include "proto/fragment_plan.h"
#include "worker/backoff.h"
#include "worker/client.h"
#include "worker/cluster.h"
#include "worker/cluster_protocol.h"
#include "worker/error_feedback.h"
#include "worker/protocol_decision.h"
#include "worker/trainer.h"
#include "worker/worker_loop.h"
#include "worker/worker_state.h"

namespace diloco {

class Worker {
 public:
  // `cluster`: null for a one-process worker; else this process is its leader (rank 0).
  Worker(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop, WorkerCluster* cluster);
  ~Worker();

  // The whole life; returns the exit code (WorkerExit).
  int Run(const TokenCache& cache);

 private:
  // What the exchange functions return to their loops.
  enum class Outcome { kGoOn, kRoundOver, kGiveUp };

  // --- phases (worker.cc) ---
  // Client and Join, then the trainer and the buffers. Returns a WorkerExit on failure, -1 on success.
  int SetUp(const TokenCache& cache);
  int SetUpTrainer(const TokenCache& cache);
  // The rounds, from the first pull until the run is complete or the worker must stop.
  void RunRounds();
  // Pulls all of theta into theta_ and loads it (unless reuse_local); sets *round. False: stop.
  bool PullAll(int64_t* round);
  // Trains the rest of this round's H steps (after those carried over from the overlap).
  StepStats Train(int64_t round);
  // The pseudo-gradient of fragment f, error-compensated, with the round's statistics; logs the round.
  RoundResult Pack(int64_t round, int f, const StepStats& stats);
  // Push and pull of the fragment, overlapped with tau steps of the next round (into carried_) when tau > 0.
  std::optional<PullResult> ExchangeRound(int64_t round, int f, const RoundResult& result);
  // Merges the pulled fragment f into the local parameters, or keeps them (late_policy reuse_local).
  void Apply(int f);
  // Logs the run's figures, stops the heartbeat thread and leaves. Returns the exit code.
  int ShutDown(double started);
  // The inner loop of the leader: with a cluster, the followers are told to do the same first.
  StepStats TrainSteps(int64_t first_step, int64_t n);
  void HeartbeatLoop();

  // --- the worker's local state, worker/worker_state.h (worker_resume.cc) ---
  // Sets the identity, resumes from a saved state of this run (workers.resume), and installs the per-step position
  // journal and the window trace. Worker clusters keep no local state yet.
  void SetUpLocalState(const TokenCache& cache, const std::string& fingerprint);
  void Resume();
  void SaveLocalState(int64_t round);  // after each push of `round` (1-based)
  void LogFirstStepAfterResume();      // once, before the first inner step after a resume

  // --- the exchange with the coordinator, following worker/protocol_decision.h (worker_exchange.cc) ---
  // Joins, retrying while the coordinator is unreachable. Returns a WorkerExit on failure, -1 on success.
  int JoinWithRetry();
  void AcceptJoin(JoinReply reply);
  // JoinWithRetry for a coordinator that forgot this worker; false (exit_code_ set) if the worker must stop.
  bool Rejoin();
  // Pushes `result` for `round` until it is counted, the round moves on, or the run ends. Returns false if the
  // worker should give up (stop, refusal).
  bool PushUntilCounted(int64_t round, const RoundResult& result);
  Outcome PushOnce(int64_t round, const RoundResult& result, bool* need_push);
  Outcome AwaitRound(int64_t round, bool* need_push);
  // After a push refused as late or quarantined: heartbeats until this worker's quarantine (if any) is over, so that
  // it does not train rounds whose pushes would be refused. A failed heartbeat ends the wait (the pull handles it).
  void WaitOutQuarantine(int64_t round);
  // Pulls all of theta (fragment -1) or one fragment into `dest`, rejoining or retrying as needed; nullopt when
  // the worker must stop (exit_code_ says why).
  std::optional<PullResult> PullWithRetry(NamedTensors& dest, int fragment);
  // PushUntilCounted, then the pull of the pushed fragment's new global value. Runs on its own thread while the
  // inner loop trains on (comm.overlap_steps): it touches only the client, the backoff and the flags.
  std::optional<PullResult> Exchange(int64_t round, const RoundResult& result, NamedTensors& fragment_theta);

  // True once a signal or an operator's drain asks this worker to go, or its cluster failed.
  bool Stopping() const { return stop_ || drain_ || failed_; }

  const Config& config_;
  const WorkerOptions& options_;
  const std::atomic<bool>& stop_;
  Backoff backoff_;
  WorkerCluster* cluster_;                 // null for a one-process worker
  std::unique_ptr<ClusterLeader> leader_;  // set with cluster_
  ProtocolState protocol_;                 // what the decisions depend on besides the status
  std::atomic<bool> failed_{false};        // a collective of the cluster failed: the exchange thread gives up too
  bool followers_left_ = false;            // the cluster stopped together (no StopCommand to send)
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<InnerTrainer> trainer_;
  JoinReply join_;
  std::atomic<int64_t> round_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> drain_{false};  // set by the heartbeat thread when the coordinator says drain
  std::atomic<bool> quit_{false};   // stop_ or drain_: polled by the inner loop to abandon a round
  bool keep_local_ = false;         // outer.late_policy reuse_local after a late push
  int exit_code_ = kWorkerDone;
  double compute_seconds_ = 0;  // inner steps, less the cluster's all-reduce waits
  int64_t assigned_steps_ = 0;  // H from the last pull (inner.adaptive_steps); 0 = inner.steps

  // Set up once (SetUp). Streaming DiLoCo: round r syncs fragment r mod P after S = H / P inner steps.
  Codec codec_ = CODEC_RAW;
  FragmentPlan plan_;
  int64_t steps_per_sync_ = 0;  // S
  int64_t overlap_steps_ = 0;   // tau (comm.overlap_steps)
  int cluster_size_ = 1;
  std::vector<std::unique_ptr<ErrorFeedback>> error_feedback_;  // per fragment; null without comm.error_feedback
  // theta_: the global value of every tensor as last received (what pseudo-gradients are computed against);
  // fragment_theta_[p]: the same tensors of fragment p (views of theta_), the destination of a fragment pull.
  NamedTensors theta_;
  std::vector<NamedTensors> fragment_theta_;
  StepStats carried_;  // inner steps already trained toward the next push (the overlap)
  // Local state (SetUpLocalState): "" state_dir_ = none kept.
  std::string fingerprint_;
  std::string state_dir_;
  StateIdentity identity_;
  bool resumed_ = false;
  bool position_warned_ = false;
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, FileCloser> windows_trace_;  // data.trace_windows
  std::vector<WindowDraw> pending_draws_;                 // this batch's windows, until its position is saved
  std::thread heartbeat_;
};

}  // namespace diloco
