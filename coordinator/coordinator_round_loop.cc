// CoordinatorCore, the round thread (coordinator.h): Run/Poll pass over lease expiry and the close decision
// (round_policy.h); a close takes the averaged pseudo-gradient out under the lock, has the theta store step
// (theta_store.h) without it, publishes theta_{t+1}, then hands the round to the sinks (round_sink.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/text_file.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"
#include "coordinator/inner_steps.h"
#include "proto/status_json.h"

namespace diloco {

StatusReply CoordinatorCore::Status() const {
  absl::MutexLock lock(&mu_);
  const std::vector<EvalRecord> evals = evals_->Records();
  StatusReply reply = BuildStatusReply({config_, theta_->round(), fragments(), model_.num_params, model_.fingerprint,
                                        round_, stats_, membership_, evals},
                                       clock_());
  for (WorkerStatus& w : *reply.mutable_workers()) {  // pushes in parts under way (push_parts.h)
    const auto [received, parts] = parts_.Progress(w.id());
    w.set_parts_received(received);
    w.set_parts(parts);
  }
  return reply;
}

void CoordinatorCore::Run() {
  absl::MutexLock lock(&mu_);
  // Members restored from the checkpoint: their lease runs from now, not from before the start-up (a large
  // checkpoint takes longer to load than coordinator.lease_s).
  for (const std::string& id : membership_.ActiveIds()) membership_.Touch(id, clock_());
  while (!stop_ && !complete_) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    if (stop_) break;
    RoundLoopPass();
    AnswerDueHeartbeats();  // a changed answer (a restart, a quarantine) or a deadline: within one wake-up
  }
}

void CoordinatorCore::Poll() {
  absl::MutexLock lock(&mu_);
  if (stop_ || complete_) return;
  RoundLoopPass();
  AnswerDueHeartbeats();
}

std::vector<HeldHeartbeats::Held> CoordinatorCore::TakeDueHeartbeats(bool all) {
  if (held_.size() == 0) return {};
  return held_.Due(
      clock_(),
      [this](const std::string& id) {
        mu_.AssertHeld();
        return HeartbeatReplyFor(id);
      },
      all);
}

void CoordinatorCore::AnswerHeld(std::vector<HeldHeartbeats::Held> due) {
  for (HeldHeartbeats::Held& h : due) h.answer(std::move(h.reply));
}

void CoordinatorCore::AnswerDueHeartbeats() {
  std::vector<HeldHeartbeats::Held> due = TakeDueHeartbeats(/*all=*/false);
  if (due.empty()) return;
  mu_.Unlock();
  AnswerHeld(std::move(due));
  mu_.Lock();
}

size_t CoordinatorCore::held_heartbeats() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

void CoordinatorCore::RoundLoopPass() {
  const double now = clock_();
  for (const std::string& id : membership_.ExpireLeases(now, config_.coordinator.lease_s)) {
    spdlog::warn("lost: worker {} (no heartbeat for {} s)", id, config_.coordinator.lease_s);
  }
  CheckWindowStall(now);  // trimmed_mean, centered_clip: a push of the set that holds the others back
  const RoundDecision decision = DecideClose(now);
  if (!decision.close) return;
  const int64_t closing_round = theta_->round() + 1;
  ClosingRound closing = BeginClose();  // under the same lock as the decision
  mu_.Unlock();
  bool discarded = false;
  std::string non_finite;
  try {
    FinishClose(closing, decision.reason);
  } catch (const NonFiniteStep& e) {  // the non-finite guard: nothing committed, the round is redone
    non_finite = e.what();
    discarded = true;
    for (at::Tensor& d : closing.delta) d.zero_();
  } catch (const std::exception& e) {  // a failed round is discarded, not fatal
    spdlog::error("round {} discarded: {}; its workers push again", closing_round, e.what());
    discarded = true;
    for (at::Tensor& d : closing.delta) d.zero_();  // theta and the momentum are as they were (StepInPlace)
  }
  mu_.Lock();
  const bool committed = !discarded || closing.delta.empty();
  if (!committed) {  // (delta empty: it failed after publishing, and the sums are back)
    accumulator_.Restore(std::move(closing.delta));
    round_.EndClose(RoundPhase::kTraining);
    // The redo waits for its pushes as a restarted aggregation does (RoundClockStart): a round already past
    // round_timeout_s would otherwise close on its first min_workers re-pushes and shut the others out.
    aggregation_restarted_at_ = clock_();
  }
  if (!non_finite.empty()) DiscardNonFiniteRound(closing_round, closing.contributors, non_finite);
}

void CoordinatorCore::DiscardNonFiniteRound(int64_t round, const RoundState::Pushes& pushes, const std::string& why) {
  spdlog::error("round {} discarded: {}; theta and the momentum keep their values; its pushes: {}", round, why,
                DescribePushNorms(pushes));
  const std::string blamed = LargestNormPush(pushes);
  if (!blamed.empty()) {
    QuarantineForRound(blamed, "the largest push norm of a round whose outer step would not be finite");
  }
}

void CoordinatorCore::QuarantineForRound(const std::string& id, const std::string& reason) {
  Member* m = membership_.Find(id);
  if (m == nullptr) return;
  ++m->broken_pushes;
  ++m->strikes;
  // At once (as a push cut as stalled), or the same push would come back and the round would never close.
  m->quarantined_until_round = theta_->round() + QuarantineRounds(m->strikes, /*cut_as_stalled=*/true);
  m->quarantine_reason = reason;
  spdlog::warn("quarantined: worker {} through round {} ({}); the other workers push again", id,
               m->quarantined_until_round, reason);
}

CloseView CoordinatorCore::CloseViewNow() const {
  std::vector<std::string> expected;
  const bool set_fixed = CoordinateWiseRounds() && window_.open();  // no one outside the set pushes in this round
  for (std::string& id : UnquarantinedActiveIds()) {
    if (!set_fixed || window_.Holds(id)) expected.push_back(std::move(id));
  }
  return {{std::move(expected), round_.PushedIds(), RoundClockStart(), QuarantinedActiveCount()},
          {round_.pushed().size(), round_.streaming_count() + parts_.partial_count()}};
}

RoundDecision CoordinatorCore::DecideClose(double now) {
  const OuterMode mode = config_.outer.mode;
  const RoundPolicyOptions options{config_.coordinator.min_workers, config_.coordinator.round_timeout_s};
  RoundDecision decision = DecideCloseOf(mode, CloseViewNow(), now, options);
  if (StreamsHoldClose(mode, decision, CloseViewNow(), PartialPushes())) {
    CutStalledPushes(now);  // a close is due but streams hold it: cut those that stalled (round_policy.h)
    decision = DecideCloseOf(mode, CloseViewNow(), now, options);
  }
  if (!LogsWaitReasons(mode)) round_.set_phase_reason(decision.reason);
  decision = HoldForPartialPushes(decision, PartialPushes());
  if (decision.reason != round_.phase_reason()) {
    round_.set_phase_reason(decision.reason);
    if (!decision.close) spdlog::info("round {}: {}", theta_->round() + 1, decision.reason);
  }
  return decision;
}

CoordinatorCore::ClosingRound CoordinatorCore::BeginClose() {
  ClosingRound c;
  c.tokens = accumulator_.total_weight();
  c.delta = accumulator_.TakeAverage();                    // no push folds while the round steps (phase stepping)
  c.contributors = round_.TakeForClose();                  // phase stepping; their heartbeats still say "pushed"
  c.far_ids = JudgeAlongMomentum(c);                       // outer.momentum_bound
  c.far_ids.merge(NoteCoordinateWiseFar(c.contributors));  // coordinate-wise rules, before the window resets
  parts_.NewRound();                                       // parts not yet in the sums are for a closed round now
  clip_gate_.Reset();  // outer.aggregation clip: the next round (or the redo) declares anew
  window_.Reset();     // trimmed_mean, centered_clip: likewise
  return c;
}

const std::vector<size_t>* CoordinatorCore::FragmentToStep() const {
  if (fragments() <= 1) return nullptr;
  return &model_.fragment_plan.members(model_.fragment_plan.FragmentOfRound(theta_->round()));
}

void CoordinatorCore::FinishClose(ClosingRound& closing, const std::string& reason) {
  for (const at::Tensor& d : closing.delta) {
    if (!AllFinite(d)) throw NonFiniteStep("the averaged pseudo-gradient is not finite");
  }
  ClosedRound closed;
  const int64_t round = theta_->round() + 1;
  double eval_seconds = 0;
  ThetaStore::CandidateCheck check;  // the evaluation, when due, before theta_{t+1} is published
  if (evaluation_ != nullptr && evaluation_->DueAt(round, round >= config_.SyncRounds())) {
    check = [&](const ParamSnapshot& candidate) { eval_seconds = evaluation_->Vet(candidate); };
  }
  {
    // The round's members as they will stand once it commits, for a checkpoint an operator asks for between the step
    // and PublishRound (which records them again; a discarded step's record is never read).
    absl::MutexLock lock(&mu_);
    RecordMembersAt(round, &closing.contributors);
  }
  const double t0 = clock_();
  closed.theta = theta_->Step(closing.delta, FragmentToStep(), check);
  const double t1 = clock_();
  closed.step_seconds = t1 - t0 - eval_seconds;
  closed.reason = reason;
  closed.pushes = closing.contributors.size();
  for (const auto& [id, ticket] : closing.contributors) closed.tokens += static_cast<double>(ticket.tokens);
  // Theta and the momentum hold round `round` now (stepped in place): from here on the round is published whatever
  // fails, or its redo would step them a second time. Without the update and the axis the workers pull in full and
  // the next round's pushes are not projected on the momentum.
  std::shared_ptr<const SparseUpdate> update;
  std::shared_ptr<const MomentumAxis> axis;
  try {
    closed.delta = &closing.delta;
    sinks_.OnStepped(closed);  // the replay log, while the delta is intact
    closed.delta = nullptr;
    update = BuildRoundUpdate(*closed.theta, closing.delta);
    axis = ReadMomentumAxis();  // outer.momentum_bound: the next round's
  } catch (const std::exception& e) {
    closed.delta = nullptr;
    spdlog::error("round {}: {} (the round is committed; the next pulls are full)", round, e.what());
  }
  std::vector<at::Tensor> sums = std::move(closing.delta);
  for (at::Tensor& d : sums) d.zero_();  // the next round's accumulator
  std::vector<HeldHeartbeats::Held> due;
  {
    absl::MutexLock lock(&mu_);
    PublishRound(closing, std::move(sums), t1, closed);
    sparse_update_ = std::move(update);
    axis_ = std::move(axis);
    // The workers waiting on this round: pull now; on the run's last round, once its checkpoint is written (below;
    // its pulls are refused until then, BeginPull), told that the run is complete.
    if (!closed.theta->complete) due = TakeDueHeartbeats(/*all=*/false);
  }
  AnswerHeld(std::move(due));
  sinks_.OnCommitted(closed);  // log line, evaluation, checkpoint
  if (!closed.theta->complete) return;
  {
    absl::MutexLock lock(&mu_);
    complete_ = true;
    round_.set_phase(RoundPhase::kComplete);
    cv_.SignalAll();
    due = TakeDueHeartbeats(/*all=*/true);
  }
  AnswerHeld(std::move(due));
  sinks_.OnRunComplete();  // summary.json
}

void CoordinatorCore::PublishRound(const ClosingRound& closing, std::vector<at::Tensor> zeroed_sums, double now,
                                   ClosedRound& closed) {
  accumulator_.Restore(std::move(zeroed_sums));
  stats_.CreditRound(closing.contributors, model_.num_params, membership_);
  for (const auto& [id, ticket] : closing.contributors) {  // resends of these pushes are "counted" from now on
    if (Member* m = membership_.Find(id)) m->last_applied_base = std::max(m->last_applied_base, ticket.base);
  }
  // Suspects count committed rounds only (a discarded round's redo would count twice), and read the members' last
  // push figures before the next round's pushes overwrite them.
  NoteClippedPushes(closing.contributors, closing.far_ids);
  previous_hashes_.clear();  // the duplicate check's replays: this round's pushes (CheckDuplicate)
  for (const auto& [id, ticket] : closing.contributors) previous_hashes_.insert(ticket.payload_hash);
  if (config_.inner.adaptive_steps) AssignAdaptiveSteps();
  RecordMembersAt(closed.theta->round);  // for this round's checkpoint
  RecordThetaId(*closed.theta);
  stats_.last_outer_step_seconds = closed.step_seconds;
  stats_.last_round_seconds = now - round_.opened_at();
  round_.set_opened_at(now);
  theta_->Publish(closed.theta);
  round_.EndClose(closed.theta->complete ? RoundPhase::kFinishing : RoundPhase::kTraining);
  round_.set_phase_reason("");
  closed.round_seconds = stats_.last_round_seconds;
  closed.tokens_committed = stats_.tokens_committed;
  closed.bytes_pushed_committed = stats_.bytes_pushed_committed;
}

void CoordinatorCore::AssignAdaptiveSteps() {
  std::map<std::string, double> speeds;
  for (const std::string& id : membership_.ActiveIds()) speeds[id] = membership_.Find(id)->steps_per_s;
  for (const auto& [id, h] : AssignInnerSteps(speeds, config_.inner.steps)) {
    Member* m = membership_.Find(id);
    if (m->inner_steps != h) {
      spdlog::info("DyLU: worker {} trains {} inner steps per round ({:.1f} steps/s)", id, h, m->steps_per_s);
    }
    m->inner_steps = h;
  }
}

void CoordinatorCore::WriteSummary() const {
  const absl::Status s =
      WriteTextFileAtomically(config_.run.output_dir + "/summary.json", StatusToJson(Status()).dump(2) + "\n");
  if (!s.ok()) spdlog::error("{}", std::string(s.message()));
}

void CoordinatorCore::Stop() {
  std::vector<HeldHeartbeats::Held> due;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
    due = TakeDueHeartbeats(/*all=*/true);
  }
  AnswerHeld(std::move(due));
}

bool CoordinatorCore::complete() const {
  absl::MutexLock lock(&mu_);
  return complete_;
}

void CoordinatorCore::WaitForWorkersToLeave(double timeout_s) {
  const double deadline = clock_() + timeout_s;
  absl::MutexLock lock(&mu_);
  // Also wait for workers that have not joined yet (a run resumed already complete): they must learn that it is
  // over, or they would retry until workers.connect_timeout_s.
  while (!stop_ && clock_() < deadline &&
         !(membership_.ActiveIds().empty() &&
           static_cast<int64_t>(membership_.members().size()) >= config_.workers.count)) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
  }
}

void CoordinatorCore::NoteWatcher(const std::string& peer, int64_t interval_ms, bool answered_complete) {
  if (interval_ms <= 0) return;
  absl::MutexLock lock(&mu_);
  const double now = clock_();
  for (auto it = watchers_.begin(); it != watchers_.end();) it = it->second.until <= now ? watchers_.erase(it) : ++it;
  if (watchers_.size() >= kMaxWatchers && watchers_.count(peer) == 0) {
    watchers_.erase(std::min_element(watchers_.begin(), watchers_.end(),
                                     [](const auto& a, const auto& b) { return a.second.until < b.second.until; }));
  }
  watchers_[peer] = {now + std::min(30.0, 2.0 * static_cast<double>(interval_ms) / 1000 + 1), answered_complete};
}

void CoordinatorCore::WaitForWatchers() {
  absl::MutexLock lock(&mu_);
  // The latest time a watcher that has not seen `complete` may still poll; <= now: none.
  const auto waiting_until = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    double until = 0;
    for (const auto& [peer, w] : watchers_) {
      if (!w.saw_complete) until = std::max(until, w.until);
    }
    return until;
  };
  if (stop_ || waiting_until() <= clock_()) return;
  spdlog::info("waiting up to {:.1f} s for status watchers (diloco-ctl status --watch) to see the run complete",
               waiting_until() - clock_());
  while (!stop_ && waiting_until() > clock_()) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
}

}  // namespace diloco
