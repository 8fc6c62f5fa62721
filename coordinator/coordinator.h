// CoordinatorCore: the state of a DiLoCo run on the coordinator side, without any networking and without the model.
//
// Owns the round: the accumulator, the membership, the round state (round_state.h), the run's counters
// (run_stats.h) and the heartbeats it holds for workers waiting on the round (held_heartbeats.h), under one mutex;
// theta_t and the outer step live in its ThetaStore (theta_store.h), and what happens after a round commits (replay
// log, log line, evaluation, checkpoint, summary.json) in its RoundSinks (round_sink.h, round_sinks.h). It is created
// from plain tensors: theta_0 by name and an Evaluator (evaluator.h) handed in by its creator (the model host,
// model_host.h, in the coordinator; fakes in tests); the model fingerprint is that of theta_0's specs. The gRPC service
// (service.h) translates RPCs into the methods below.
//
// Asynchronous mode (outer.mode async): a "round" is one version of theta. A push computed against any version at
// most outer.max_staleness behind is accepted; the round closes as soon as a push has committed and no other is
// streaming, and its pseudo-gradient is applied at once (Delayed Nesterov, delayed_nesterov.h, with the nesterov
// optimizer). Pushes that commit together are averaged into one arrival. The rules of both modes: round_policy.h;
// how theta is kept in each: theta_store.h. Nothing else here asks which mode runs.
//
// Round lifecycle: round t+1 is open while theta_t is published; pushes tagged with round t are folded
// into the accumulator chunk by chunk; the round thread (Run) closes the round when DecideCloseOf says so, has the
// store step and publish theta_{t+1}, and hands the round to the sinks (log line, checkpoints when due).
// The non-finite guard (issue 32 item 4): a round whose averaged delta, stepped theta or momentum would hold a NaN or
// an Inf, or whose stepped theta evaluates to a non-finite validation loss (when an evaluation is due, it runs on the
// stepped theta before it is published: ThetaStore::Step's check), is not committed: theta and the momentum keep
// their values bit for bit, the round's pushes are logged with their norms and discarded, the largest push's member
// is quarantined and the round is redone (DiscardNonFiniteRound). No pull, checkpoint or status shows such a theta.
// If a push breaks off after some of its chunks were folded, the round's aggregation restarts (accumulator zeroed,
// `epoch` bumped): every worker whose push was counted sees pushed=false in its next heartbeat and pushes again.
// So the global model only ever sees complete pseudo-gradients.
//
// Memory (issue 18; 1 copy = 4 bytes x params): synchronous rounds hold 3 copies of the model: theta (stepped in
// place, OuterStep::StepInPlace, and read by pulls under a ThetaGuard, theta_store.h: fp32 pulls are served from its
// memory, coordinator/pull_payload.h, and a pull that finds theta moved on mid-stream is refused with UNAVAILABLE and
// the worker pulls again), the outer momentum (updated in place) and the round accumulator (handed to the step as the
// round's delta, shown to the replay log sink, and taken back zeroed). The evaluation reads theta without a
// copy; to undo a step that it refuses, the store spills the stepped tensors' theta and momentum to an unlinked file
// before an evaluated round's step (theta_store.h: disk, not memory; an exact undo otherwise needs a fourth copy). An
// encoding pull codec adds its encoded copy of the newest round (bf16: half a copy), shared by all pulls
// (pull_payload.h). Asynchronous rounds keep theta_{t-1} as an immutable snapshot beside theta_t (pulls of older
// versions are useful there and theta moves with every push), so they hold one copy more; Delayed Nesterov keeps its
// own buffers (delayed_nesterov.h). Buffers are allocated and faulted in at Create (no cold first round).
// outer.momentum_bound (coordinator_momentum.cc) reads the momentum in place while pushes fold (no copy).
// Sparse pulls (sparse_pull.h; topk pushes, outer momentum 0) keep the last round's update as encoded pull messages,
// at most 1/8 of a copy (a larger update is dropped); without momentum there is no momentum copy, so such a run holds
// about 2 copies plus the update.
//
// Thread-safety: every public method is thread-safe. The round's state lives under one absl::Mutex (mu_), annotated
// (ABSL_GUARDED_BY) and checked by clang's -Wthread-safety (scripts/check-thread-safety). Lock order: mu_, then the
// store's and the eval history's (leaf locks); the checkpoint writer's lock and the sync guard are never taken with
// mu_ held. The store's Step/Publish and the sinks belong to the round thread; Run() is called by exactly one thread.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinate_window.h"
#include "coordinator/evaluator.h"
#include "coordinator/held_heartbeats.h"
#include "coordinator/membership.h"
#include "coordinator/push_parts.h"
#include "coordinator/round_accumulator.h"
#include "coordinator/round_policy.h"
#include "coordinator/round_sinks.h"
#include "coordinator/round_state.h"
#include "coordinator/run_stats.h"
#include "coordinator/sparse_pull.h"
#include "coordinator/theta_store.h"
#include "proto/checkpoint.h"
#include "proto/diloco.pb.h"
#include "proto/fragment_plan.h"
#include "proto/tensor_spec.h"
#include "proto/topk_codec.h"

namespace diloco {

class CoordinatorCore {
 public:
  using Clock = std::function<double()>;  // seconds
  using WrittenCheckpoint = diloco::WrittenCheckpoint;

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
  // The coordinator's own data (config/model_spec.h DataSpecOf), which Join compares with each worker's. Call before
  // serving (Join reads it without a lock); unset, no worker's data is checked.
  void set_data(DataSpec data) { data_ = std::move(data); }
  absl::Status Leave(const LeaveRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<HeartbeatReply> Heartbeat(const HeartbeatRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, answered through `answer`: at once, or, when the request's wait_ms > 0 and the answer is Holdable
  // (held_heartbeats.h), later from the round thread (Run, Poll, the close, Stop) once the answer changes or
  // min(wait_ms, kMaxHeartbeatHoldMs) has passed. `answer` runs without mu_ held and must not block.
  void Heartbeat(const HeartbeatRequest& request, HeldHeartbeats::Answer answer) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BeginPull(const PullRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  void CountBytesSent(const std::string& worker_id, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Sparse pulls (sparse_pull.h): the kept update that takes the request's have_round to theta at `round`, when
  // the request may have it (whole model, no range, have_round = round - 1); else null (the pull is dense).
  std::shared_ptr<const SparseUpdate> SparseUpdateFor(const PullRequest& request, int64_t round) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The inner steps this worker should train next (DyLU with inner.adaptive_steps: its share, inner.steps before
  // it is measured); 0 without inner.adaptive_steps: the worker trains its own inner.steps (PullHeader.inner_steps).
  int64_t InnerStepsFor(const std::string& worker_id) const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<PushTicket> BeginPush(const PushHeader& header) ABSL_LOCKS_EXCLUDED(mu_);
  // Folds one validated chunk (values: 1-D float view) of tensor `index` at element `offset`. wire_bytes: the
  // chunk's encoded payload size, for the byte counters (-1: the size of `values`).
  absl::Status FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                         int64_t wire_bytes = -1) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a validated topk chunk (comm.codec topk), folded straight from its kept values: no dense copy
  // (coordinator/coordinator_sparse.cc). `count`: the chunk's elements.
  absl::Status FoldSparseChunk(PushTicket& ticket, size_t index, int64_t offset, int64_t count,
                               const SparseChunk& sparse, int64_t wire_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CommitPush(PushTicket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  void AbortPush(PushTicket& ticket, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  // Operator requests: ask a worker to leave (it sees drain in its heartbeat); write a checkpoint now.
  absl::Status Drain(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocking file I/O: call it off the gRPC threads (any thread). In synchronous rounds the next outer step waits
  // for it (CheckpointWriter::Write, round_sinks.h).
  absl::StatusOr<WrittenCheckpoint> CheckpointNow() ABSL_LOCKS_EXCLUDED(mu_);
  // Why the last round's checkpoint could not be written (CheckpointWriter::final_error); "" when it was.
  std::string final_checkpoint_error() const { return checkpoints_->final_error(); }

  StatusReply Status() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::vector<TensorSpec>& specs() const { return model_.specs; }
  // Streaming DiLoCo: comm.fragments, and for fragment f the positions of its tensors in specs() and their specs.
  int fragments() const { return model_.fragment_plan.fragments(); }
  const std::vector<size_t>& fragment_members(int f) const { return model_.fragment_plan.members(f); }
  const std::vector<TensorSpec>& fragment_specs(int f) const {
    return model_.fragment_specs.at(static_cast<size_t>(f));
  }
  const std::string& fingerprint() const { return model_.fingerprint; }
  // The ingest threads the service should run (ingest_queue.h): a coordinate-wise outer.aggregation makes a push that
  // runs ahead wait on its ingest thread (coordinate_window.h), so it needs one per member plus room for progress.
  int ingest_threads() const;

  // The round loop: closes rounds, steps, hands them to the sinks. Returns when the run is complete (after the
  // final checkpoint and summary) or after Stop().
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // One pass of the round loop without waiting (lease expiry, the close decision, the outer step when due): for tests
  // and the fuzz target that drive the core without a round thread. Never call it while Run() runs.
  void Poll() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the round loop and answers every held heartbeat.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Heartbeats held now (HeartbeatRequest.wait_ms): for tests and the status page.
  size_t held_heartbeats() const ABSL_LOCKS_EXCLUDED(mu_);
  bool complete() const ABSL_LOCKS_EXCLUDED(mu_);
  // After completion: waits until workers.count members have joined and none is active (they saw run_complete and
  // left), or timeout_s passes.
  void WaitForWorkersToLeave(double timeout_s) ABSL_LOCKS_EXCLUDED(mu_);
  // A status answered to the watcher at `peer` polling every interval_ms (StatusRequest.watch_interval_ms > 0), with
  // phase complete or not. After completion, WaitForWatchers waits until every watcher was answered complete, or 2 of
  // its intervals plus 1 s (at most 30 s) passed since its last poll; at once when none polled. At most
  // kMaxWatchers are remembered (the one due soonest makes room).
  void NoteWatcher(const std::string& peer, int64_t interval_ms, bool answered_complete) ABSL_LOCKS_EXCLUDED(mu_);
  void WaitForWatchers() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes Status() as JSON to <run.output_dir>/summary.json (atomically). Done at completion; call again to record
  // the final member states.
  void WriteSummary() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The model's facts, fixed at creation: specs (in theta_0's order), the fragments of Streaming DiLoCo and the
  // fingerprint.
  struct Model {
    explicit Model(std::vector<TensorSpec> specs, int64_t fragments);
    std::vector<TensorSpec> specs;
    FragmentPlan fragment_plan;
    std::vector<std::vector<TensorSpec>> fragment_specs;
    std::string fingerprint;
    int64_t num_params = 0;
  };
  CoordinatorCore(const Config& config, std::vector<TensorSpec> specs, std::unique_ptr<ThetaStore> theta,
                  std::shared_ptr<EvalHistory> evals, Clock clock);
  // The sinks, in order (round_sinks.h); the evaluation sink when coordinator.eval_every > 0.
  void AddSinks(std::unique_ptr<Evaluator> evaluator);
  absl::Status CheckMeta(const RequestMeta& meta, bool require_member) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The heartbeat answer for member `id` now (round, pushed, phase, drain, quarantine); no lease refresh.
  HeartbeatReply HeartbeatReplyFor(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes out the held heartbeats that are due (held_heartbeats.h), all of them with `all`; answer them with
  // AnswerHeld once mu_ is released. AnswerDueHeartbeats does both, releasing mu_ while it answers.
  std::vector<HeldHeartbeats::Held> TakeDueHeartbeats(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void AnswerHeld(std::vector<HeldHeartbeats::Held> due);
  void AnswerDueHeartbeats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a push with this header may start now (lease, round and staleness, duplicates, header values).
  absl::Status CheckPushHeader(const PushHeader& header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RoundDecision DecideClose(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round as the close decision sees it. The members it waits for are the unquarantined active ones, or, once a
  // coordinate-wise rule has fixed the round's set (coordinator_window.cc), those of them in the set: a member that
  // joined after the set was fixed cannot push in this round, so the round must not wait for it.
  CloseView CloseViewNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push of `id` broke off after folding chunks (or was cut as stalled): counts the strike and quarantines the
  // member per round_policy.h's QuarantineRounds.
  void RecordBrokenPush(const std::string& id, bool cut_as_stalled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A close is due: cuts the push streams that stalled (round_policy.h "Broken pushes"); restarts the aggregation
  // if any of them had chunks in the sums.
  void CutStalledPushes(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> UnquarantinedActiveIds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Active members quarantined for the open round: past round_timeout_s excused from coordinator.min_workers
  // (round_policy.h PushesNeeded), as they may not push until the round closes.
  size_t QuarantinedActiveCount() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The headers the clip gate or the window needs before it fixes its set, of `expected` unquarantined active
  // members: coordinator.min_workers, or when `force` (ForceSetNow) PushesNeeded, which past the timeout excuses the
  // members quarantined for the round where the others cannot make min_workers up.
  size_t HeadersNeeded(bool force, size_t expected) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the clip gate or the coordinate-wise window fixes its set without the members that have not declared: the
  // round is older than coordinator.round_timeout_s and the aggregation has not restarted within
  // min(lease_s, round_timeout_s) (the pushes a restart dropped get that long to come back).
  bool ForceSetNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the open round's round_timeout_s runs from: its opening, or later after its aggregation restarted (a broken
  // push, a discarded outer step), so that its timeout comes no sooner than min(lease_s, round_timeout_s) after the
  // restart: the members pushing again have that long before a close or a fixed set leaves them out.
  double RoundClockStart() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Discards the round's aggregation so far (sums, parts, the clip gate's and the window's sets, which the pushes
  // that come back form again) and notes when; returns the counted pushes dropped (they push again).
  size_t DiscardAggregation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes in parts (push_parts.h): checks a part's header and joins it to its member's assembly (a refusal
  // discards the assembly); a member's complete push is counted by CountPush.
  absl::Status BeginPart(const PushHeader& header, PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitPart(PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTED for a part whose assembly was discarded (another part broke or was refused, or a newer attempt began).
  absl::Status StalePartRefusal(const PushTicket& ticket) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CountPush(const PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops member `id`'s assembly of parts; restarts the aggregation if any part had chunks in the sums.
  void DiscardParts(const std::string& id, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Some push of `id` is in the sums and will never complete: zero the sums, every counted push starts over.
  void RestartAggregation(const std::string& id, int64_t round, const std::string& why, bool cut_as_stalled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push streams with chunks in the sums, and members with parts in the sums: the round may not close under them.
  size_t PartialPushes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round_.partial_count() + parts_.partial_count() + (window_.open() && !window_.complete() ? 1 : 0);
  }
  absl::Status CutRefusal(const PushTicket& ticket) const;  // FAILED_PRECONDITION for a push cut as stalled
  // Releases mu_ while the outer step runs; holds it again on return.
  void RoundLoopPass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closing a round: BeginClose (mu_ held, same critical section as the decision) takes the averaged
  // pseudo-gradient and the contributors out; FinishClose (no lock) checks the average is finite, has the store step
  // and publish theta_{t+1} and runs the sinks. If FinishClose throws, the round is discarded and its workers push
  // again.
  struct ClosingRound {
    std::vector<at::Tensor> delta;
    RoundState::Pushes contributors;
    double tokens = 0;
    std::set<std::string> far_ids;  // pushes far beyond clip, bound or trim: toward suspect once the round commits
  };
  ClosingRound BeginClose() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On success, closing.delta has gone back to the accumulator; after a throw it is still in `closing`. When an
  // evaluation is due for the round, it runs on the stepped theta before it is published (the store's check,
  // theta_store.h): a non-finite loss throws NonFiniteStep with theta and the momentum put back (unless the step
  // could not be spilled: then it stays committed and the loss is logged).
  void FinishClose(ClosingRound& closing, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // The positions the next step updates: the round's fragment (Streaming DiLoCo), or null for all.
  const std::vector<size_t>* FragmentToStep() const;
  // FinishClose under mu_: books the round, publishes closed.theta (stepped at `now`), gives the zeroed sums back to
  // the accumulator, fills in the round's timings and totals.
  void PublishRound(const ClosingRound& closing, std::vector<at::Tensor> zeroed_sums, double now, ClosedRound& closed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sparse pulls: the update of the round that stepped to `theta` by `delta` (the average), when SparsePullsApply
  // and it fits SparseUpdateLimit; else null (coordinator_sparse.cc).
  std::shared_ptr<const SparseUpdate> BuildRoundUpdate(const ParamSnapshot& theta,
                                                       const std::vector<at::Tensor>& delta) const;
  void AssignAdaptiveSteps() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // DyLU: next round's H of every active worker
  // Members across a restart: the members (active and lost, not those that left) as round `round` commits, and the
  // ids of the thetas before it that pushes may still be computed against, kept for that round's checkpoint
  // (records_at_, the last few rounds); RecordsAt reads them into a checkpoint's data (a leaf lock: the checkpoint
  // writer calls it while it reads theta). RestoreMembers (Create): a checkpoint's active members become active
  // again when it was written under this config (ConfigHash), else lost until they join again, and its lost ones
  // stay lost; either way their records (shard, counted pushes) stand.
  // `counted` (optional): the round's contributors, whose last counted round is taken as their pushes' base.
  void RecordMembersAt(int64_t round, const RoundState::Pushes* counted = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordThetaId(const ParamSnapshot& theta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // into theta_ids_
  int64_t ThetaIdsKept() const;  // how many rounds' theta ids theta_ids_ keeps (sync 1, async max_staleness + 1)
  void RecordsAt(int64_t round, CheckpointData& data) const ABSL_LOCKS_EXCLUDED(members_mu_);
  void RestoreMembers(const std::string& members_config, const std::vector<MemberRecord>& members)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The non-finite guard (issue 32): round `round`'s step would have made theta or the momentum non-finite, or the
  // evaluation of its theta was not finite, and was not committed. Logs each push's norm and quarantines the
  // largest-norm push's member at once (the others push again, so the round is redone without it).
  void DiscardNonFiniteRound(int64_t round, const RoundState::Pushes& pushes, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Quarantines member `id` for the rest of the open round at once (a strike; the reason for the log line).
  void QuarantineForRound(const std::string& id, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // outer.aggregation clip (sync rounds): declares the header's claimed norm and tokens; UNAVAILABLE until the
  // round's fold is open (ClipGate), else sets the ticket's capped weight and fold scale.
  absl::Status AdmitToClip(const PushHeader& header, PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // outer.aggregation clip at the end of a push: its real norm against the claim (2% relative). A mismatch restarts
  // the round's aggregation, quarantines the member and returns INVALID_ARGUMENT.
  absl::Status CheckClaimedNorm(const PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks a chunk passes before it folds (its round still open, its stream and parts current, no restart since
  // it began), and the bookkeeping after (norm, progress, bytes): shared by the dense and the sparse fold.
  absl::Status AdmitFold(const PushTicket& ticket) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteFold(PushTicket& ticket, double squared_norm, uint64_t chunk_hash, int64_t wire_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The duplicate check (docs/operations.md "Robust aggregation"), under every rule but mean in sync rounds, at the
  // end of a push: a push whose payload hash equals a counted push's of the open round (a copy) or any committed
  // push's of the previous round (a replay) is refused with FAILED_PRECONDITION, its member counts a duplicate and
  // sits out the round, and the round's aggregation restarts without it. Exact copies only: one changed bit passes.
  absl::Status CheckDuplicate(const PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // outer.aggregation trimmed_mean / centered_clip in sync rounds (coordinator_window.cc, coordinate_window.h).
  bool CoordinateWiseRounds() const;
  // Declares the push; UNAVAILABLE until the round's set of pushes is fixed (or when it is fixed without this one),
  // else sets the ticket's weight (1/k: every push of the set counts alike).
  absl::Status AdmitToWindow(const PushHeader& header, PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands one checked chunk to the window, first waiting (mu_ released) while the push is window_chunks ahead of the
  // slowest push of the set; a reduced chunk goes into the accumulator.
  absl::Status FoldToWindow(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round loop's pass: when a member of the set whose push has not finished is no longer active (lost or left),
  // restarts the aggregation without it; when the window has not advanced for coordinator.lease_s,
  // CutWindowLaggards.
  void CheckWindowStall(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts the window's slowest pushes as stalled (a member of the set that never streamed included), quarantines
  // them and restarts the aggregation.
  void CutWindowLaggards() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A counted push's norm and clip factor on its member.
  void RecordPushNorm(Member& m, const PushTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginClose: each contributor's member counts a round held back (its push clipped to under 1 / outer.flag_margin
  // of its norm, or in `far_ids`: far along the momentum or trimmed) or starts over; the suspect flag
  // (outer.flag_rounds), logged once.
  void NoteClippedPushes(const RoundState::Pushes& contributors, const std::set<std::string>& far_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // trimmed_mean, or centered_clip with outer.cclip_norm_clip off: nothing scales a push by its norm.
  bool CoordinateWiseWithoutNormClip() const;
  // BeginClose under a coordinate-wise rule, before the window is reset: sets each contributor's trimmed share
  // (trimmed_mean: the share of its coordinates the trim dropped); the ids far beyond (outer.flag_margin): under
  // trimmed_mean a kept share under 1 / margin of an even trim's (aggregation_rule.h TrimKeptScale), and without a
  // norm clip a norm over margin x the round's median. Empty under mean and clip.
  std::set<std::string> NoteCoordinateWiseFar(const RoundState::Pushes& contributors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // outer.momentum_bound (coordinator_momentum.cc): whether the pushes' projections on the outer momentum are taken
  // in this run (clip, trimmed_mean, centered_clip; sync rounds, comm.fragments 1, one weight per push), and whether
  // the bound acts on the average (clip: its average is a weighted sum of the pushes, from which the excess along
  // the momentum can be taken; a coordinate-wise rule's is not, so there the bound only judges: the flag).
  bool MomentumWatched() const;
  bool MomentumBoundApplies() const;
  // The outer momentum after the last step, read in place (handles, no copy), and its norm; null when it is not
  // watched or there is no momentum yet. Takes the store's steady read: never with mu_ held (the round thread
  // after a step, Create before the first round).
  std::shared_ptr<const MomentumAxis> ReadMomentumAxis() const ABSL_LOCKS_EXCLUDED(mu_);
  // BeginClose, after the average is taken: computes each contributor's projection on the momentum and its bound
  // (MomentumBound), sets its momentum cosine; under clip takes the excess out of closing.delta along the momentum.
  // Returns the ids whose projection lay far beyond the bound (FarBeyond, outer.flag_margin), under every rule.
  std::set<std::string> JudgeAlongMomentum(ClosingRound& closing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fixed at creation.
  const Config config_;
  const Clock clock_;
  const Model model_;
  // theta_t, the outer step, and their readers' rules (thread-safe; Step/Publish on the round thread).
  const std::unique_ptr<ThetaStore> theta_;
  const std::shared_ptr<EvalHistory> evals_;  // thread-safe
  // The round thread's (Run/Poll, FinishClose), and Create's before it: never touched by the request threads.
  RoundSinks sinks_;
  CheckpointWriter* checkpoints_ = nullptr;  // in sinks_; Write is thread-safe (CheckpointNow)
  EvaluationSink* evaluation_ = nullptr;     // in sinks_ (null without coordinator.eval_every); the round thread's

  std::atomic<int> push_port_{0};
  DataSpec data_;  // set_data's, before serving; then read-only
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on membership changes, commits, completion and Stop
  RoundAccumulator accumulator_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);
  RoundState round_ ABSL_GUARDED_BY(mu_);
  PushParts parts_ ABSL_GUARDED_BY(mu_);
  ClipGate clip_gate_ ABSL_GUARDED_BY(mu_){config_.outer.clip_factor, config_.outer.max_token_weight};
  CoordinateWindow window_ ABSL_GUARDED_BY(mu_){CoordinateWindowOptionsOf(config_, model_.specs)};
  double aggregation_restarted_at_ ABSL_GUARDED_BY(mu_) = -1e300;  // clock_() at the last DiscardAggregation
  RunStats stats_ ABSL_GUARDED_BY(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  struct Watcher {
    double until = 0;           // wait for it until then (clock_)
    bool saw_complete = false;  // ... unless its last answer said complete
  };
  static constexpr size_t kMaxWatchers = 64;
  std::map<std::string, Watcher> watchers_ ABSL_GUARDED_BY(mu_);  // by peer address (NoteWatcher)
  // Sparse pulls: the last committed round's update (null: none, or too large), built by the round thread.
  std::shared_ptr<const SparseUpdate> sparse_update_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  HeldHeartbeats held_ ABSL_GUARDED_BY(mu_);  // answered by the round thread (Run, Poll, FinishClose) and Stop
  // The duplicate check: the payload hashes of the last committed round's pushes.
  std::set<uint64_t> previous_hashes_ ABSL_GUARDED_BY(mu_);
  // outer.momentum_bound: the momentum the open round's pushes are projected on (set after each committed step; the
  // tensors are the store's, written only by a step, while no push of the round folds); each clip ticket holds it too,
  // so that a chunk's dot is taken outside mu_.
  std::shared_ptr<const MomentumAxis> axis_ ABSL_GUARDED_BY(mu_);
  // The ids of the last published thetas by round (ParamSnapshot::id; sync: the current one, async: as far back as
  // outer.max_staleness): a push whose RequestMeta.theta_id names another theta of its round is refused.
  std::map<int64_t, uint64_t> theta_ids_ ABSL_GUARDED_BY(mu_);
  struct RoundRecords {
    std::vector<MemberRecord> members;
    std::vector<ThetaIdRecord> earlier_theta_ids;
    RunTotalsRecord totals;
  };
  mutable absl::Mutex members_mu_;  // a leaf: taken under mu_ (RecordMembersAt) and alone (RecordsAt)
  std::map<int64_t, RoundRecords> records_at_ ABSL_GUARDED_BY(members_mu_);
};

}  // namespace diloco
