// CoordinatorCore: the state of a DiLoCo run on the coordinator side, without any networking and without the model.
//
// Owns theta_t, the outer step and its momentum (outer_step.h), the round accumulator, the membership, the round
// state (round_state.h), the evaluation history, the run's counters (run_stats.h) and checkpoints. It is created from
// plain tensors: theta_0 by name and an Evaluator (evaluator.h) handed in by its creator (the model host,
// model_host.h, in the coordinator; fakes in tests); the model fingerprint is that of theta_0's specs.
// The gRPC service (service.h) translates RPCs into the methods below.
//
// Asynchronous mode (outer.mode async): a "round" is one version of theta. A push computed against any version at
// most outer.max_staleness behind is accepted; the round closes as soon as a push has committed and no other is
// streaming, and its pseudo-gradient is applied at once (Delayed Nesterov, delayed_nesterov.h, with the nesterov
// optimizer). Pushes that commit together are averaged into one arrival. The rules: round_policy.h.
//
// Round lifecycle: round t+1 is open while theta_t is published; pushes tagged with round t are folded
// into the accumulator chunk by chunk; the round thread (Run) closes the round when DecideRoundClose says so,
// applies the outer step, publishes theta_{t+1}, evaluates and checkpoints when due.
// If a push breaks off after some of its chunks were folded, the round's aggregation restarts (accumulator zeroed,
// `epoch` bumped): every worker whose push was counted sees pushed=false in its next heartbeat and pushes again.
// So the global model only ever sees complete pseudo-gradients.
//
// Memory (issue 18; 1 copy = 4 bytes x params): synchronous rounds hold 3 copies of the model: theta (stepped in
// place, OuterStep::StepInPlace, and read by pulls under a ThetaGuard, evaluator.h: fp32 pulls are served from its
// memory, coordinator/pull_payload.h, and a pull that finds theta moved on mid-stream is refused with UNAVAILABLE and
// the worker pulls again), the outer momentum (updated in place) and the round accumulator (handed to the step as the
// round's delta and taken back zeroed). The evaluator reads theta without a copy. An encoding pull codec adds its
// encoded copy of the newest round (bf16: half a copy), shared by all pulls (pull_payload.h). Asynchronous rounds keep
// theta_{t-1} as an immutable snapshot beside theta_t (pulls of older versions are useful there and theta moves with
// every push), so they hold one copy more; Delayed Nesterov keeps its own buffers (delayed_nesterov.h). Buffers are
// allocated and faulted in at Create (no cold first round).
//
// Thread-safety: every public method is thread-safe. The round's state lives under one absl::Mutex (mu_), annotated
// (ABSL_GUARDED_BY) and checked by clang's -Wthread-safety (scripts/check-thread-safety); the outer step and the
// evaluator belong to the round thread; Run() is called by exactly one thread.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "coordinator/evaluator.h"
#include "coordinator/membership.h"
#include "coordinator/outer_step.h"
#include "coordinator/round_accumulator.h"
#include "coordinator/round_policy.h"
#include "coordinator/round_state.h"
#include "coordinator/run_stats.h"
#include "proto/checkpoint.h"
#include "proto/diloco.pb.h"
#include "proto/fragment_plan.h"
#include "proto/tensor_spec.h"

namespace diloco {

class CoordinatorCore {
 public:
  using Clock = std::function<double()>;  // seconds

  // theta_0: the initial parameters (float32, by name, in the model's order); their specs make the model
  // fingerprint. evaluator: the validation loss of a theta, evaluated once on theta_0 and then every
  // coordinator.eval_every rounds (may be null when eval_every <= 0). With `resume`, the newest valid checkpoint in
  // the checkpoint directory replaces theta_0 (bootstrap.h).
  static absl::StatusOr<std::unique_ptr<CoordinatorCore>> Create(const Config& config, NamedTensors theta_0,
                                                                 std::unique_ptr<Evaluator> evaluator,
                                                                 bool resume = false, Clock clock = nullptr);
  ~CoordinatorCore();

  absl::StatusOr<JoinReply> Join(const JoinRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // comm.transport tcp: the port Join replies name for pushes (TcpPushListener's); 0 = push over gRPC.
  void set_push_port(int port) { push_port_ = port; }
  absl::Status Leave(const LeaveRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<HeartbeatReply> Heartbeat(const HeartbeatRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BeginPull(const PullRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  void CountBytesSent(const std::string& worker_id, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The inner steps this worker should train next (DyLU with inner.adaptive_steps; else inner.steps).
  int64_t InnerStepsFor(const std::string& worker_id) const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<PushTicket> BeginPush(const PushHeader& header) ABSL_LOCKS_EXCLUDED(mu_);
  // Folds one validated chunk (values: 1-D float view) of tensor `index` at element `offset`. wire_bytes: the
  // chunk's encoded payload size, for the byte counters (-1: the size of `values`).
  absl::Status FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                         int64_t wire_bytes = -1) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CommitPush(PushTicket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  void AbortPush(PushTicket& ticket, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  // Operator requests: ask a worker to leave (it sees drain in its heartbeat); write a checkpoint now.
  absl::Status Drain(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  struct WrittenCheckpoint {
    std::string path;
    int64_t round = 0;
  };
  // Blocking file I/O: call it off the gRPC threads. In synchronous rounds the next outer step waits for it.
  absl::StatusOr<WrittenCheckpoint> CheckpointNow() ABSL_LOCKS_EXCLUDED(mu_, checkpoint_mu_);

  StatusReply Status() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Streaming DiLoCo: comm.fragments, and for fragment f the positions of its tensors in specs() and their specs.
  int fragments() const { return fragment_plan_.fragments(); }
  const std::vector<size_t>& fragment_members(int f) const { return fragment_plan_.members(f); }
  const std::vector<TensorSpec>& fragment_specs(int f) const { return fragment_specs_.at(static_cast<size_t>(f)); }
  const std::string& fingerprint() const { return fingerprint_; }

  // The round loop: closes rounds, steps, evaluates, checkpoints. Returns when the run is complete (after writing
  // the final checkpoint and summary) or after Stop().
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // One pass of the round loop without waiting (lease expiry, the close decision, the outer step when due): for tests
  // and the fuzz target that drive the core without a round thread. Never call it while Run() runs.
  void Poll() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  bool complete() const ABSL_LOCKS_EXCLUDED(mu_);
  // After completion: waits until workers.count members have joined and none is active (they saw run_complete and
  // left), or timeout_s passes.
  void WaitForWorkersToLeave(double timeout_s) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes Status() as JSON to <run.output_dir>/summary.json (atomically). Done at completion; call again to record
  // the final member states.
  void WriteSummary() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CoordinatorCore(const Config& config, std::vector<TensorSpec> specs, std::unique_ptr<Evaluator> evaluator,
                  Clock clock);
  absl::Status CheckMeta(const RequestMeta& meta, bool require_member) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a push with this header may start now (lease, round and staleness, duplicates, header values).
  absl::Status CheckPushHeader(const PushHeader& header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RoundDecision DecideClose(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The close rule over counted pushes and members (sync) or pushes and open streams (async), before any hold.
  RoundDecision DecideCloseIgnoringStreams(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push of `id` broke off after folding chunks (or was cut as stalled): counts the strike and quarantines the
  // member per round_policy.h's QuarantineRounds.
  void RecordBrokenPush(const std::string& id, bool cut_as_stalled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A close is due: cuts the push streams that stalled (round_policy.h "Broken pushes"); restarts the aggregation
  // if any of them had chunks in the sums.
  void CutStalledPushes(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> UnquarantinedActiveIds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CutRefusal(const PushTicket& ticket) const;  // FAILED_PRECONDITION for a push cut as stalled
  // Releases mu_ while the outer step runs; holds it again on return.
  void RoundLoopPass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closing a round: BeginClose (mu_ held, same critical section as the decision) takes the averaged
  // pseudo-gradient and the contributors out; FinishClose (no lock) checks the average is finite, applies the outer
  // step and publishes theta_{t+1}. If FinishClose throws, the round is discarded and its workers push again.
  struct ClosingRound {
    std::shared_ptr<const ParamSnapshot> base;
    std::vector<at::Tensor> delta;
    RoundState::Pushes contributors;
    std::vector<at::Tensor> recycle;
    double tokens = 0;
  };
  ClosingRound BeginClose() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On success, closing.delta has gone back to the accumulator; after a throw it is still in `closing`.
  void FinishClose(ClosingRound& closing, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // theta_{t+1}: stepped in place (synchronous rounds) or into new tensors (asynchronous rounds).
  std::shared_ptr<ParamSnapshot> StepTheta(const ParamSnapshot& base, const std::vector<at::Tensor>& delta,
                                           std::vector<at::Tensor> recycle) ABSL_LOCKS_EXCLUDED(mu_);
  // FinishClose under mu_: books the round, publishes `snapshot`, gives the zeroed sums back to the accumulator.
  void PublishRound(const ClosingRound& closing, std::shared_ptr<const ParamSnapshot> snapshot,
                    std::vector<at::Tensor> zeroed_sums, double step_seconds, double now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignAdaptiveSteps() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // DyLU: next round's H of every active worker
  void EvaluateIfDue(const ParamSnapshot& snapshot, bool force) ABSL_LOCKS_EXCLUDED(mu_);
  void CheckpointIfDue(bool force) ABSL_LOCKS_EXCLUDED(mu_, checkpoint_mu_);
  // The published theta_t + its momentum; serialized by checkpoint_mu_.
  absl::StatusOr<WrittenCheckpoint> WriteCheckpoint() ABSL_LOCKS_EXCLUDED(mu_, checkpoint_mu_);
  absl::StatusOr<WrittenCheckpoint> SaveCheckpointAndLog(const CheckpointData& data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  bool async() const { return config_.outer.mode == OuterMode::kAsync; }

  // Fixed at creation.
  const Config config_;
  const Clock clock_;
  std::vector<TensorSpec> specs_;
  FragmentPlan fragment_plan_;
  std::vector<std::vector<TensorSpec>> fragment_specs_;
  std::string fingerprint_;
  int64_t num_params_ = 0;
  // The round thread's (Run/Poll, FinishClose): never touched by the request threads.
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<OuterStep> outer_step_;

  absl::Mutex checkpoint_mu_;  // one checkpoint write at a time (round thread and operator requests)
  std::atomic<int> push_port_{0};
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on membership changes, commits, completion and Stop
  // Synchronous rounds: the round theta's tensors hold (they are stepped in place); null for asynchronous rounds.
  // Set once in Create, before any other thread runs.
  std::shared_ptr<ThetaGuard> guard_;
  std::shared_ptr<const ParamSnapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  // Asynchronous rounds: theta_{t-1}, whose memory is reused when no pull holds it.
  std::shared_ptr<const ParamSnapshot> previous_snapshot_ ABSL_GUARDED_BY(mu_);
  // Asynchronous rounds: the outer momentum after the step that produced snapshot_ (never modified in place there).
  std::vector<at::Tensor> momentum_snapshot_ ABSL_GUARDED_BY(mu_);
  RoundAccumulator accumulator_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);
  RoundState round_ ABSL_GUARDED_BY(mu_);
  RunStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<EvalRecord> evals_ ABSL_GUARDED_BY(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace diloco
