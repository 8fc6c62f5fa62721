// CoordinatorCore: the state of a DiLoCo run on the coordinator side, without any networking.
//
// Owns theta_t (published as immutable snapshots, so a pull in flight keeps a consistent theta while the next one
// is computed), the outer optimizer and its momentum, the round accumulator, the membership, the evaluation history,
// byte counters and checkpoints. The gRPC service (service.h) translates RPCs into the methods below.
//
// Asynchronous mode (outer.mode async): a "round" is one version of theta. A push computed against any version at
// most outer.max_staleness behind is accepted; the round closes as soon as a push has committed and no other is
// streaming, and its pseudo-gradient is applied at once (Delayed Nesterov, delayed_nesterov.h, with the nesterov
// optimizer). Pushes that commit together are averaged into one arrival.
//
// Round lifecycle (DESIGN.md §2): round t+1 is open while theta_t is published; pushes tagged with round t are folded
// into the accumulator chunk by chunk; the round thread (Run) closes the round when DecideRoundClose says so,
// applies the outer step, publishes theta_{t+1}, evaluates and checkpoints when due.
// If a push breaks off after some of its chunks were folded, the round's aggregation restarts (accumulator zeroed,
// `epoch` bumped): every worker whose push was counted sees pushed=false in its next heartbeat and pushes again.
// So the global model only ever sees complete pseudo-gradients.
//
// Thread-safety: every public method is thread-safe (one mutex); Run() is called by exactly one thread.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "coordinator/checkpoint.h"
#include "coordinator/delayed_nesterov.h"
#include "coordinator/membership.h"
#include "coordinator/outer_optimizer.h"
#include "coordinator/round_accumulator.h"
#include "coordinator/round_policy.h"
#include "proto/diloco.pb.h"
#include "proto/fragment_plan.h"
#include "proto/tensor_spec.h"

namespace diloco {

class Evaluator;

struct ParamSnapshot {
  int64_t round = 0;
  bool complete = false;
  std::vector<std::pair<std::string, at::Tensor>> params;  // theta_round, float32, never modified once published
};

// One push in flight: created by BeginPush, passed to FoldChunk and CommitPush/AbortPush.
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
  int64_t bytes = 0;
  bool folded_any = false;
  bool finished = false;
};

class CoordinatorCore {
 public:
  using Clock = std::function<double()>;  // seconds

  // Builds theta_0 (random init from model: and run.seed, or model.init_from), loads the validation split from
  // `cache`, and evaluates theta_0 once if eval_every > 0. With `resume`, the newest valid checkpoint in the
  // checkpoint directory replaces all that (theta_t, outer momentum, round, eval history); corrupt files are
  // skipped with a warning.
  static absl::StatusOr<std::unique_ptr<CoordinatorCore>> Create(const Config& config, const TokenCache& cache,
                                                                 bool resume = false, Clock clock = nullptr);
  ~CoordinatorCore();

  absl::StatusOr<JoinReply> Join(const JoinRequest& request);
  // comm.transport tcp: the port Join replies name for pushes (TcpPushListener's); 0 = push over gRPC.
  void set_push_port(int port) { push_port_ = port; }
  absl::Status Leave(const LeaveRequest& request);
  absl::StatusOr<HeartbeatReply> Heartbeat(const HeartbeatRequest& request);
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BeginPull(const PullRequest& request);
  void CountBytesSent(const std::string& worker_id, int64_t bytes);
  // The inner steps this worker should train next (DyLU with inner.adaptive_steps; else inner.steps).
  int64_t InnerStepsFor(const std::string& worker_id) const;

  absl::StatusOr<PushTicket> BeginPush(const PushHeader& header);
  // Folds one validated chunk (values: 1-D float view) of tensor `index` at element `offset`. wire_bytes: the
  // chunk's encoded payload size, for the byte counters (-1: the size of `values`).
  absl::Status FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                         int64_t wire_bytes = -1);
  absl::Status CommitPush(PushTicket& ticket);
  void AbortPush(PushTicket& ticket, const std::string& why);

  // Operator requests: ask a worker to leave (it sees drain in its heartbeat); write a checkpoint now.
  absl::Status Drain(const std::string& worker_id);
  struct WrittenCheckpoint {
    std::string path;
    int64_t round = 0;
  };
  absl::StatusOr<WrittenCheckpoint> CheckpointNow();  // blocking file I/O: call it off the gRPC threads

  StatusReply Status() const;
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Streaming DiLoCo: comm.fragments, and for fragment f the positions of its tensors in specs() and their specs.
  int fragments() const { return fragment_plan_.fragments(); }
  const std::vector<size_t>& fragment_members(int f) const { return fragment_plan_.members(f); }
  const std::vector<TensorSpec>& fragment_specs(int f) const { return fragment_specs_.at(static_cast<size_t>(f)); }
  const std::string& fingerprint() const { return fingerprint_; }

  // The round loop: closes rounds, steps, evaluates, checkpoints. Returns when the run is complete (after writing
  // the final checkpoint and summary) or after Stop().
  void Run();
  // One pass of the round loop without waiting (lease expiry, the close decision, the outer step when due): for tests
  // and the fuzz target that drive the core without a round thread. Never call it while Run() runs.
  void Poll();
  void Stop();
  bool complete() const;
  // After completion: waits until workers.count members have joined and none is active (they saw run_complete and
  // left), or timeout_s passes.
  void WaitForWorkersToLeave(double timeout_s);
  // Writes Status() as JSON to <run.output_dir>/summary.json (atomically). Done at completion; call again to record
  // the final member states.
  void WriteSummary() const;

 private:
  CoordinatorCore(const Config& config, Clock clock);
  absl::Status CheckMeta(const RequestMeta& meta, bool require_member) const;  // mu_ held
  void RoundLoopPass(std::unique_lock<std::mutex>& lock);                     // mu_ held by `lock`
  // Closing a round: BeginClose (mu_ held, same critical section as the decision) takes the averaged
  // pseudo-gradient and the contributors out; FinishClose (no lock) checks the average is finite, applies the outer
  // step and publishes theta_{t+1}. If FinishClose throws, the round is discarded and its workers push again.
  struct ClosingRound {
    std::shared_ptr<const ParamSnapshot> base;
    std::vector<at::Tensor> delta;
    std::map<std::string, PushTicket> contributors;
    std::vector<at::Tensor> recycle;
    double tokens = 0;
  };
  ClosingRound BeginClose();
  void FinishClose(ClosingRound closing, const std::string& reason);
  void EvaluateIfDue(const ParamSnapshot& snapshot, bool force);
  void CheckpointIfDue(bool force);
  absl::StatusOr<WrittenCheckpoint> WriteCheckpoint();  // the published theta_t + its momentum; serialized by checkpoint_mu_

  const Config config_;
  const Clock clock_;
  std::vector<TensorSpec> specs_;
  FragmentPlan fragment_plan_;
  std::vector<std::vector<TensorSpec>> fragment_specs_;
  std::string fingerprint_;
  int64_t num_params_ = 0;
  std::unique_ptr<Evaluator> evaluator_;  // round thread only
  OuterOptimizer outer_;                   // round thread only
  std::unique_ptr<DelayedNesterov> dn_;    // outer.mode async with outer.optimizer nesterov; round thread only
  bool async() const { return config_.outer.mode == OuterMode::kAsync; }

  std::mutex checkpoint_mu_;  // one checkpoint write at a time (round thread and operator requests)
  std::atomic<int> push_port_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const ParamSnapshot> snapshot_;
  std::shared_ptr<const ParamSnapshot> previous_snapshot_;  // theta_{t-1}: its memory is reused when no pull holds it
  std::vector<at::Tensor> spare_sums_;                       // zeroed accumulator for the next round (round thread)
  std::vector<at::Tensor> momentum_snapshot_;  // outer momentum after the step that produced snapshot_
  RoundAccumulator accumulator_;
  Membership membership_;
  std::map<std::string, PushTicket> pushed_;  // pushes counted in the open round, by worker id
  std::set<std::string> streaming_;           // workers with a push stream open (one at a time each)
  std::set<std::string> partial_;             // ... of which some chunks are already in the sums: blocks closing
  std::set<std::string> closing_;             // contributors of the round being stepped (heartbeats: pushed)
  int64_t epoch_ = 0;                 // bumped when the open round's aggregation restarts or the round closes
  double round_opened_at_ = 0;
  std::string phase_ = "training";
  std::string phase_reason_;
  std::vector<EvalRecord> evals_;
  int64_t bytes_received_ = 0;
  int64_t bytes_sent_ = 0;
  int64_t bytes_pushed_committed_ = 0;
  int64_t tokens_committed_ = 0;  // tokens of the committed rounds (all workers)
  int64_t dp_equivalent_bytes_ = 0;
  int64_t last_round_bytes_pushed_ = 0;
  double last_round_seconds_ = 0;
  double last_outer_step_seconds_ = 0;
  bool complete_ = false;
  bool stop_ = false;
};

}  // namespace diloco
