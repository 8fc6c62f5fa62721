// The Worker's calls to the coordinator (worker/worker.h): Join, Push, Pull and Heartbeat with their retries. Each
// status goes through worker/protocol_decision.h; these functions do what it says and log its reason.
#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "config/model_spec.h"
#include "proto/tensor_spec.h"
#include "worker/worker.h"

namespace diloco {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int Worker::JoinWithRetry() {
  const double deadline = Now() + config_.workers.connect_timeout_s;
  bool warned = false, hinted = false;
  backoff_.Reset();
  while (!Stopping()) {
    auto reply = client_->Join(ModelSpecOf(config_.model), static_cast<int32_t>(config_.workers.threads),
                               config_.workers.device, trainer_ ? join_.shard_index() : -1,
                               static_cast<int32_t>(config_.comm.fragments), cluster_ ? cluster_->size() : 1);
    ProtocolState state = protocol_;
    state.connect_deadline_passed = Now() > deadline;
    const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kJoin, reply.status(), state);
    if (decision.action == ProtocolAction::kProceed) {
      AcceptJoin(*std::move(reply));
      return -1;
    }
    if (decision.action != ProtocolAction::kRetry) {
      spdlog::error("{}", decision.reason);
      return decision.exit_code;
    }
    if (!decision.hint.empty() && !hinted)
      spdlog::warn("coordinator {}: {}; retrying", options_.coordinator, decision.hint);
    hinted = hinted || !decision.hint.empty();
    if (!warned) spdlog::info("waiting for coordinator {} ...", options_.coordinator);
    warned = true;
    backoff_.Sleep(stop_);
  }
  return kWorkerInterrupted;
}

void Worker::AcceptJoin(JoinReply reply) {
  if (trainer_ && reply.shard_index() != join_.shard_index()) {
    spdlog::warn("rejoined with shard {} instead of {}; this worker keeps reading shard {}", reply.shard_index(),
                 join_.shard_index(), join_.shard_index());
    reply.set_shard_index(join_.shard_index());
  }
  join_ = std::move(reply);
  spdlog::info("joined {} at round {}: shard {}/{}; pushes over {}", options_.coordinator, join_.round(),
               join_.shard_index(), join_.shard_count(),
               join_.push_port() > 0 ? absl::StrCat("tcp to port ", join_.push_port()) : std::string("grpc"));
}

bool Worker::Rejoin() {
  if (int code = JoinWithRetry(); code >= 0) {
    exit_code_ = code;
    return false;
  }
  return true;
}

bool Worker::PushUntilCounted(int64_t round, const RoundResult& result) {
  backoff_.Reset();
  bool need_push = true;
  while (!Stopping()) {
    Outcome outcome = Outcome::kGoOn;
    if (need_push) {
      outcome = PushOnce(round, result, &need_push);
    } else {
      if (drain_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      outcome = AwaitRound(round, &need_push);
    }
    if (outcome != Outcome::kGoOn) return outcome == Outcome::kRoundOver;
  }
  exit_code_ = kWorkerDone;  // asked to go (signal or drain): a clean leave
  return false;
}

Worker::Outcome Worker::PushOnce(int64_t round, const RoundResult& result, bool* need_push) {
  const double t0 = Now();
  auto pushed = client_->Push(round, result);
  const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kPush, pushed.status(), protocol_);
  switch (decision.action) {
    case ProtocolAction::kProceed:
      spdlog::info("round {}: pushed {} bytes in {:.3f} s", round + 1, *pushed, Now() - t0);
      *need_push = false;
      backoff_.Reset();
      return Outcome::kGoOn;
    case ProtocolAction::kNextRound:
      keep_local_ = decision.keep_local;
      spdlog::warn("round {}: {}", round + 1, decision.reason);
      WaitOutQuarantine(round);
      return Outcome::kRoundOver;  // the round moved on: pull the new parameters
    case ProtocolAction::kCounted:
      *need_push = false;
      return Outcome::kGoOn;
    case ProtocolAction::kRejoin:  // then push again
      return Rejoin() ? Outcome::kGoOn : Outcome::kGiveUp;
    case ProtocolAction::kRepush:
      return Outcome::kGoOn;
    case ProtocolAction::kRetry:
      spdlog::warn("round {}: {}", round + 1, decision.reason);
      backoff_.Sleep(stop_);
      return Outcome::kGoOn;
    case ProtocolAction::kGiveUp:
      break;
  }
  spdlog::error("round {}: {}", round + 1, decision.reason);
  exit_code_ = decision.exit_code;
  return Outcome::kGiveUp;
}

void Worker::WaitOutQuarantine(int64_t round) {
  bool logged = false;
  while (!Stopping()) {
    auto beat = client_->Heartbeat(round);
    if (!beat.ok()) return;
    const WaitDecision wait =
        DecideAfterRefusal({beat->round(), beat->pushed(), beat->run_complete(), beat->quarantined_until_round()});
    if (wait.action != WaitAction::kKeepWaiting) {
      if (logged) spdlog::info("quarantine over at round {}: training again", beat->round() + 1);
      return;
    }
    if (!logged) spdlog::warn("{}", wait.reason);
    logged = true;
    for (int i = 0; i < 10 && !Stopping(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Worker::Outcome Worker::AwaitRound(int64_t round, bool* need_push) {
  auto beat = client_->Heartbeat(round);
  const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kHeartbeat, beat.status(), protocol_);
  if (decision.action == ProtocolAction::kRejoin) {
    if (!Rejoin()) return Outcome::kGiveUp;
    *need_push = true;  // a restarted coordinator has not counted our push
    return Outcome::kGoOn;
  }
  if (decision.action == ProtocolAction::kRetry) {
    backoff_.Sleep(stop_);
    return Outcome::kGoOn;
  }
  if (decision.action != ProtocolAction::kProceed) {
    spdlog::error("{}", decision.reason);
    exit_code_ = decision.exit_code;
    return Outcome::kGiveUp;
  }
  if (beat->drain()) drain_ = quit_ = true;
  const WaitDecision wait = DecideWhileWaiting({beat->round(), beat->pushed(), beat->run_complete()}, round,
                                               config_.outer.mode == OuterMode::kAsync);
  if (wait.action == WaitAction::kRoundClosed) return Outcome::kRoundOver;
  if (wait.action == WaitAction::kRepush) {
    spdlog::info("round {}: {}", round + 1, wait.reason);
    *need_push = true;
  }
  return Outcome::kGoOn;
}

std::optional<PullResult> Worker::PullWithRetry(NamedTensors& dest, int fragment) {
  backoff_.Reset();
  while (!Stopping()) {
    auto pulled = client_->Pull(dest, fragment);
    const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kPull, pulled.status(), protocol_);
    if (decision.action == ProtocolAction::kProceed) return *pulled;
    if (decision.action == ProtocolAction::kRejoin) {
      if (!Rejoin()) return std::nullopt;
      continue;
    }
    if (decision.action != ProtocolAction::kRetry) {
      spdlog::error("{}", decision.reason);
      exit_code_ = decision.exit_code;
      return std::nullopt;
    }
    spdlog::warn("{}", decision.reason);
    backoff_.Sleep(stop_);
  }
  return std::nullopt;
}

std::optional<PullResult> Worker::Exchange(int64_t round, const RoundResult& result, NamedTensors& fragment_theta) {
  if (!PushUntilCounted(round, result)) return std::nullopt;
  return PullWithRetry(fragment_theta, result.fragment);
}

}  // namespace diloco
