// CoordinatorSession: a worker's side of the protocol with the coordinator: the client, the backoff, the Join reply,
// and what to do on every status code of Join, Push, Pull and Heartbeat, as worker/protocol_decision.h decides it
// (retry after the backoff, join again, push again, wait out a quarantine, give up). Each call returns once it has
// succeeded, once the worker is asked to go (RunFlags::Stopping), or once the worker must give up; then failure()
// says why (OK when it was asked to go), with the exit code attached (worker/worker_options.h).
// Thread-safety: owned by the exchange thread. The worker's main thread makes the calls itself (Join, the full Pull)
// and, with comm.overlap_steps, hands Exchange to its exchange thread and touches the session again only after
// joining it. client() may be used from any thread (the heartbeat thread's Heartbeats); the flags are atomics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"
#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"
#include "worker/backoff.h"
#include "worker/client.h"
#include "worker/protocol_decision.h"
#include "worker/round_result.h"
#include "worker/run_flags.h"
#include "worker/worker_options.h"

namespace diloco {

class CoordinatorSession {
 public:
  // The client to options.coordinator with the model's `fingerprint` and the security.* credentials (an unreadable
  // file is a config error).
  static absl::StatusOr<std::unique_ptr<CoordinatorSession>> Open(const Config& config, const WorkerOptions& options,
                                                                  const std::string& fingerprint, int cluster_size,
                                                                  RunFlags& flags);

  // Joins, retrying while the coordinator is unreachable (until workers.connect_timeout_s). After a first Join a
  // rejoin asks for the same shard and keeps it whatever the reply says; the first asks for PreferShard's.
  absl::Status Join();
  // The shard the first Join asks for (the one a restarted worker read before: SavedShardHint); -1, none.
  void PreferShard(int shard) { first_shard_hint_ = shard; }
  // What every Join says of the worker's data (JoinRequest.data: its tokenizer's digest and data.split).
  void DeclareData(DataSpec data) { data_ = std::move(data); }
  // Pulls all of theta (fragment -1) or one fragment into `dest`, joining again or retrying as needed; nullopt when
  // the worker must stop. With parts (UseParts), all of theta into an empty `dest` is the ranks' part pulls.
  // have_round >= 0: dest holds theta_{have_round} bit for bit, so the first attempt may be a sparse pull
  // (PROTOCOL.md "Sparse pulls"); any retry pulls all of it.
  std::optional<PullResult> Pull(NamedTensors& dest, int fragment, int64_t have_round = -1);
  // Pushes `result` for `round` until it is counted or the round moves on (joining again, pushing again, waiting out
  // a quarantine as decided), then pulls the pushed fragment's new global value into `fragment_theta`. Nullopt when
  // the worker must stop. Runs on the exchange thread while the inner loop trains on (comm.overlap_steps).
  // have_round: as Pull's (the worker passes `round` when fragment_theta is all of theta_round).
  std::optional<PullResult> Exchange(int64_t round, const RoundResult& result, NamedTensors& fragment_theta,
                                     int64_t have_round = -1);
  // comm.cluster_parts: Exchange's pushes and pull go through these (rank 0's PartLeader, worker/part_exchange.h)
  // instead of the client: one attempt each, whose status is decided on as a one-stream push's or pull's is.
  using PartPush = std::function<absl::StatusOr<int64_t>(int64_t round, const RoundResult& result)>;
  using PartPull = std::function<absl::StatusOr<PullResult>()>;
  void UseParts(PartPush push, PartPull pull) {
    part_push_ = std::move(push);
    part_pull_ = std::move(pull);
  }
  // Called (on Exchange's thread) the first time an Exchange's push is counted (accepted, or found already counted),
  // before the wait for the round's close: the worker saves its local state then (worker.cc).
  void OnPushCounted(std::function<void(int64_t round)> f) { on_counted_ = std::move(f); }
  // Leave, with the reason the coordinator logs.
  void Leave(const std::string& reason) { (void)client_->Leave(reason); }

  // True once after a push refused as late with outer.late_policy reuse_local: the next round starts from the local
  // parameters, not the pulled ones.
  bool TakeKeepLocal();
  // True once after this worker was quarantined (its push had the largest norm of a round whose step was not
  // finite): with comm.fragments > 1 or comm.overlap_steps the next round starts from a whole pull of theta, not
  // from local parameters merged with one fragment.
  bool TakeFullPull();
  // Whether the last Exchange's push was counted, as far as this worker can see: its last attempt was accepted (or
  // found already counted) and no re-push or rejoin was asked for before the round ended for it (closed, or the
  // worker stopped). False after a refusal (late, quarantined, stale). A push discarded by an aggregation restart
  // in the last moments before the close (between two held heartbeats) still reads as counted. Read after Exchange.
  bool push_counted() const { return push_counted_; }
  const absl::Status& failure() const { return failure_; }
  const JoinReply& join() const { return join_; }
  bool joined() const { return joined_; }  // a Join succeeded (the coordinator knows this worker until it leaves)
  CoordinatorClient& client() { return *client_; }

 private:
  enum class Outcome { kGoOn, kRoundOver, kGiveUp };  // what a step of PushUntilCounted says to its loop

  CoordinatorSession(const Config& config, const WorkerOptions& options, int cluster_size, RunFlags& flags,
                     std::unique_ptr<CoordinatorClient> client);
  void AcceptJoin(JoinReply reply);
  // Join for a coordinator that forgot this worker; false if the worker must stop (failure_ set, or left OK when it
  // was asked to go meanwhile).
  bool Rejoin();
  bool PushUntilCounted(int64_t round, const RoundResult& result);
  Outcome PushOnce(int64_t round, const RoundResult& result, bool* need_push);
  Outcome AwaitRound(int64_t round, bool* need_push);
  // After a push refused as late or quarantined, or discarded with a quarantine: heartbeats until this worker's
  // quarantine (if any) is over, so that it does not train rounds whose pushes would be refused (a quarantined worker
  // then pulls: never outer.late_policy reuse_local). A failed heartbeat ends the wait (the pull handles it).
  // `announced`: the caller logged why it waits. Returns kRepush when the round still waits for this push (sync:
  // DecideAfterRefusal; once a round), else kRoundClosed (pull).
  WaitAction WaitAfterRefusal(int64_t round, bool announced = false);
  Outcome GiveUp(const ProtocolDecision& decision, const std::string& prefix = "");
  // Before a retry of a transient failure: once the coordinator has answered no call (the heartbeat thread's
  // included) for workers.connect_timeout_s, gives up with exit 4 naming `last_error` and returns true (a retry
  // loop against a coordinator that is gone, after the run ended or a crash it never came back from, was endless).
  bool CoordinatorGone(const std::string& last_error);
  // Pull's loop around one attempt (`once`).
  std::optional<PullResult> PullWith(const std::function<absl::StatusOr<PullResult>()>& once);

  // Set at construction, read-only after.
  const Config& config_;
  const int cluster_size_;
  const ProtocolState protocol_;                     // what the decisions depend on besides the status
  RunFlags& flags_;                                  // atomics: read by every thread
  const std::unique_ptr<CoordinatorClient> client_;  // thread-safe: shared with the heartbeat thread
  // The exchange thread's (see above).
  Backoff backoff_{5.0};
  JoinReply join_;
  bool joined_ = false;                      // a Join succeeded once: later ones keep its shard
  int first_shard_hint_ = -1;                // the shard the first Join asks for (PreferShard)
  DataSpec data_;                            // DeclareData's
  std::set<std::string> join_warned_;        // CheckJoinedRun's warnings printed so far
  bool keep_local_ = false;                  // outer.late_policy reuse_local after a late push
  bool full_pull_ = false;                   // TakeFullPull()
  int64_t repushed_after_refusal_ = -1;      // the round whose refused push was pushed again (DecideAfterRefusal)
  bool push_counted_ = false;                // push_counted()
  std::function<void(int64_t)> on_counted_;  // OnPushCounted
  absl::Status failure_;                     // why the worker must stop (OK: asked to go, or not stopping)
  PartPush part_push_;                       // comm.cluster_parts (empty: the client's one-stream push and pull)
  PartPull part_pull_;
};

}  // namespace diloco
