// CoordinatorCore, the round thread (coordinator.h): Run/Poll pass over lease expiry and the close decision
// (round_policy.h); a close takes the averaged pseudo-gradient out under the lock, applies the outer step
// (outer_step.h) without it, publishes theta_{t+1}, then evaluates and checkpoints when due.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "config/text_file.h"
#include "coordinator/coordinator.h"
#include "coordinator/inner_steps.h"
#include "coordinator/replay_log.h"
#include "proto/status_json.h"

namespace diloco {

StatusReply CoordinatorCore::Status() const {
  absl::MutexLock lock(&mu_);
  return BuildStatusReply(
      {config_, snapshot_->round, fragments(), num_params_, fingerprint_, round_, stats_, membership_, evals_},
      clock_());
}

void CoordinatorCore::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && !complete_) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    if (stop_) break;
    RoundLoopPass();
  }
}

void CoordinatorCore::Poll() {
  absl::MutexLock lock(&mu_);
  if (!stop_ && !complete_) RoundLoopPass();
}

void CoordinatorCore::RoundLoopPass() {
  const double now = clock_();
  for (const std::string& id : membership_.ExpireLeases(now, config_.coordinator.lease_s)) {
    spdlog::warn("lost: worker {} (no heartbeat for {} s)", id, config_.coordinator.lease_s);
  }
  const RoundDecision decision = DecideClose(now);
  if (!decision.close) return;
  const int64_t closing_round = snapshot_->round + 1;
  ClosingRound closing = BeginClose();  // under the same lock as the decision
  mu_.Unlock();
  bool discarded = false;
  try {
    FinishClose(closing, decision.reason);
  } catch (const std::exception& e) {  // a failed round is discarded, not fatal
    spdlog::error("round {} discarded: {}; its workers push again", closing_round, e.what());
    discarded = true;
    for (at::Tensor& d : closing.delta) d.zero_();  // theta and the momentum are as they were (StepInPlace)
  }
  mu_.Lock();
  if (discarded && !closing.delta.empty()) {  // (empty: it failed after publishing, and the sums are back)
    accumulator_.Restore(std::move(closing.delta));
    round_.EndClose(RoundPhase::kTraining);
  }
}

RoundDecision CoordinatorCore::DecideCloseIgnoringStreams(double now) {
  if (async()) {  // apply what has arrived, once no other push is half in the sums
    return DecideAsyncClose({round_.pushed().size(), round_.streaming_count()});
  }
  const RoundPolicyOptions options{config_.coordinator.min_workers, config_.coordinator.round_timeout_s};
  return DecideRoundClose({UnquarantinedActiveIds(), round_.PushedIds(), round_.opened_at()}, now, options);
}

RoundDecision CoordinatorCore::DecideClose(double now) {
  RoundDecision decision = DecideCloseIgnoringStreams(now);
  const bool held = async() ? round_.streaming_count() > 0 && round_.pushed().size() > 0
                            : decision.close && round_.partial_count() > 0;
  if (held) {  // a close is due but streams hold it: cut those that stalled (round_policy.h "Broken pushes")
    CutStalledPushes(now);
    decision = DecideCloseIgnoringStreams(now);
  }
  if (async()) round_.set_phase_reason(decision.reason);  // changes with every push: not logged
  decision = HoldForPartialPushes(decision, round_.partial_count());
  if (decision.reason != round_.phase_reason()) {
    round_.set_phase_reason(decision.reason);
    if (!decision.close) spdlog::info("round {}: {}", snapshot_->round + 1, decision.reason);
  }
  return decision;
}

CoordinatorCore::ClosingRound CoordinatorCore::BeginClose() {
  ClosingRound c;
  c.base = snapshot_;
  c.tokens = accumulator_.total_weight();
  c.delta = accumulator_.TakeAverage();    // no push folds while the round steps (phase stepping)
  c.contributors = round_.TakeForClose();  // phase stepping; their heartbeats still say "pushed"
  if (previous_snapshot_ && previous_snapshot_.use_count() == 1) {  // no pull reads theta_{t-1} any more
    for (const auto& [name, p] : previous_snapshot_->params) c.recycle.push_back(p);
  }
  previous_snapshot_.reset();
  return c;
}

std::shared_ptr<ParamSnapshot> CoordinatorCore::StepTheta(const ParamSnapshot& base,
                                                          const std::vector<at::Tensor>& delta,
                                                          std::vector<at::Tensor> recycle) {
  std::vector<at::Tensor> theta;
  for (const auto& [name, p] : base.params) theta.push_back(p);
  const std::vector<size_t>* only =
      fragments() > 1 ? &fragment_plan_.members(fragment_plan_.FragmentOfRound(base.round)) : nullptr;
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->round = base.round + 1;
  snapshot->complete = snapshot->round >= config_.SyncRounds();
  snapshot->guard = guard_;
  if (guard_ != nullptr) {  // pulls and checkpoints of theta_t wait, then find it moved on
    absl::MutexLock stepping(&guard_->mu);
    outer_step_->StepInPlace(theta, delta, only);
    guard_->round = snapshot->round;
    snapshot->params = base.params;
    return snapshot;
  }
  std::vector<at::Tensor> next = outer_step_->Step(theta, delta, std::move(recycle), only);
  for (size_t i = 0; i < next.size(); ++i) snapshot->params.emplace_back(base.params[i].first, next[i]);
  return snapshot;
}

void CoordinatorCore::FinishClose(ClosingRound& closing, const std::string& reason) {
  const ParamSnapshot& base = *closing.base;
  for (const at::Tensor& d : closing.delta) {
    if (!AllFinite(d)) throw std::runtime_error("the averaged pseudo-gradient is not finite");
  }
  const double t0 = clock_();
  std::shared_ptr<ParamSnapshot> snapshot = StepTheta(base, closing.delta, std::move(closing.recycle));
  const double t1 = clock_();
  if (const std::string& dir = config_.coordinator.replay_log_dir; !dir.empty()) {
    std::vector<std::string> names;
    for (const TensorSpec& spec : specs_) names.push_back(spec.name);
    const absl::Status s = WriteReplayDelta(dir, snapshot->round, fingerprint_, names, closing.delta);
    if (!s.ok()) spdlog::error("replay log of round {}: {}", snapshot->round, std::string(s.message()));
  }
  std::vector<at::Tensor> sums = std::move(closing.delta);
  for (at::Tensor& d : sums) d.zero_();  // the next round's accumulator
  double round_seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    PublishRound(closing, snapshot, std::move(sums), t1 - t0, t1);
    round_seconds = stats_.last_round_seconds;
  }
  spdlog::info("round {}/{} closed ({}): {} pushes, {:.0f} tokens, outer step {:.3f} s, round {:.2f} s",
               snapshot->round, config_.SyncRounds(), reason, closing.contributors.size(), closing.tokens, t1 - t0,
               round_seconds);
  EvaluateIfDue(*snapshot, snapshot->complete);
  CheckpointIfDue(snapshot->complete);
  if (snapshot->complete) {
    {
      absl::MutexLock lock(&mu_);
      complete_ = true;
      round_.set_phase(RoundPhase::kComplete);
      cv_.SignalAll();
    }
    WriteSummary();
  }
}

void CoordinatorCore::PublishRound(const ClosingRound& closing, std::shared_ptr<const ParamSnapshot> snapshot,
                                   std::vector<at::Tensor> zeroed_sums, double step_seconds, double now) {
  accumulator_.Restore(std::move(zeroed_sums));
  stats_.CreditRound(closing.contributors, num_params_, membership_);
  if (config_.inner.adaptive_steps) AssignAdaptiveSteps();
  stats_.last_outer_step_seconds = step_seconds;
  stats_.last_round_seconds = now - round_.opened_at();
  round_.set_opened_at(now);
  if (guard_ == nullptr) {
    previous_snapshot_ = snapshot_;
    momentum_snapshot_ = outer_step_->momentum_buffers();
  }
  snapshot_ = std::move(snapshot);
  round_.EndClose(snapshot_->complete ? RoundPhase::kFinishing : RoundPhase::kTraining);
  round_.set_phase_reason("");
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

void CoordinatorCore::EvaluateIfDue(const ParamSnapshot& snapshot, bool force) {
  const int64_t every = config_.coordinator.eval_every;
  if (every <= 0 || (!force && snapshot.round % every != 0)) return;
  const double t0 = clock_();
  double loss = 0;
  try {
    loss = evaluator_->Evaluate(snapshot.params);
  } catch (const std::exception& e) {
    spdlog::error("evaluation of round {} failed, training goes on: {}", snapshot.round, e.what());
    return;
  }
  spdlog::info("eval: round {} val_loss {:.4f} (ppl {:.2f}, {:.2f} s)", snapshot.round, loss, std::exp(loss),
               clock_() - t0);
  absl::MutexLock lock(&mu_);
  evals_.push_back({snapshot.round, loss, stats_.tokens_committed, stats_.bytes_pushed_committed});
}

void CoordinatorCore::CheckpointIfDue(bool force) {
  {
    absl::MutexLock lock(&mu_);
    const int64_t every = config_.coordinator.checkpoint_every;
    if (!force && (every <= 0 || snapshot_->round % every != 0)) return;
  }
  auto path = WriteCheckpoint();
  if (!path.ok()) spdlog::error("checkpoint failed, training goes on: {}", std::string(path.status().message()));
}

absl::StatusOr<CoordinatorCore::WrittenCheckpoint> CoordinatorCore::WriteCheckpoint() {
  absl::MutexLock writing(&checkpoint_mu_);
  CheckpointData data;
  data.fingerprint = fingerprint_;
  auto collect = [&] {
    absl::MutexLock lock(&mu_);
    data.round = snapshot_->round;
    data.params = snapshot_->params;
    data.evals = evals_;
    data.momentum = momentum_snapshot_;  // asynchronous rounds: published with theta_t, never modified in place
  };
  if (guard_ == nullptr) {
    collect();
    return SaveCheckpointAndLog(data);
  }
  // Synchronous rounds step theta and the momentum in place: no step runs while they are written, and the round is
  // the one the tensors hold (a step may have finished before its snapshot was published).
  absl::ReaderMutexLock steady(&guard_->mu);
  collect();
  data.round = guard_->round;
  data.momentum = outer_step_->momentum_buffers();  // the round thread is not stepping: we hold the guard
  return SaveCheckpointAndLog(data);
}

absl::StatusOr<CoordinatorCore::WrittenCheckpoint> CoordinatorCore::SaveCheckpointAndLog(const CheckpointData& data) {
  const std::string path = CheckpointPath(config_.CheckpointDir(), data.round);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = SaveCheckpoint(path, data);
  if (!s.ok()) return s;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  const double mb = static_cast<double>(std::filesystem::file_size(path, ec)) / 1e6;
  PruneCheckpoints(config_.CheckpointDir(), config_.coordinator.keep_checkpoints);
  spdlog::info("checkpoint: {} (round {}, {:.0f} MB in {:.2f} s, {:.0f} MB/s)", path, data.round, ec ? 0.0 : mb,
               seconds, seconds > 0 && !ec ? mb / seconds : 0.0);
  return WrittenCheckpoint{path, data.round};
}

void CoordinatorCore::WriteSummary() const {
  const absl::Status s =
      WriteTextFileAtomically(config_.run.output_dir + "/summary.json", StatusToJson(Status()).dump(2) + "\n");
  if (!s.ok()) spdlog::error("{}", std::string(s.message()));
}

void CoordinatorCore::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  cv_.SignalAll();
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

}  // namespace diloco
