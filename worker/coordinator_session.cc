// CoordinatorSession (worker/coordinator_session.h): Join, Push, Pull and Heartbeat with their retries. Each status
// goes through worker/protocol_decision.h; these functions do what it says and log its reason.
#include "worker/coordinator_session.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "config/model_spec.h"
#include "proto/codec.h"
#include "proto/heartbeat_wait.h"
#include "proto/sparse_update.h"
#include "proto/tensor_chunks.h"
#include "proto/transport_security.h"

namespace diloco {
namespace {

constexpr double kAwaitPollS = 0.1;  // between heartbeats after a push, when the coordinator does not hold them

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ProtocolState ProtocolStateOf(const Config& config, const WorkerOptions& options) {
  ProtocolState state;
  state.coordinator = options.coordinator;
  state.worker_id = options.id;
  state.tls = !config.security.tls_ca.empty() || !config.security.tls_cert.empty();
  state.late_policy = config.outer.late_policy;
  state.connect_timeout_s = config.workers.connect_timeout_s;
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorSession>> CoordinatorSession::Open(const Config& config,
                                                                             const WorkerOptions& options,
                                                                             const std::string& fingerprint,
                                                                             int cluster_size, RunFlags& flags) {
  const SecurityConfig& sec = config.security;
  auto security = LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, sec.server_name});
  if (!security.ok()) return WithExitCode(security.status(), kWorkerConfigError);
  auto client =
      std::make_unique<CoordinatorClient>(options.coordinator, options.id, fingerprint, config.workers.rpc_timeout_s,
                                          config.comm.chunk_bytes, CodecOf(config.comm.codec), std::move(*security));
  client->set_topk({config.comm.topk_chunk, config.comm.topk_per_chunk});
  return std::unique_ptr<CoordinatorSession>(
      new CoordinatorSession(config, options, cluster_size, flags, std::move(client)));
}

CoordinatorSession::CoordinatorSession(const Config& config, const WorkerOptions& options, int cluster_size,
                                       RunFlags& flags, std::unique_ptr<CoordinatorClient> client)
    : config_(config),
      cluster_size_(cluster_size),
      protocol_(ProtocolStateOf(config, options)),
      flags_(flags),
      client_(std::move(client)) {}

absl::Status CoordinatorSession::Join() {
  const double deadline = Now() + config_.workers.connect_timeout_s;
  bool warned = false, hinted = false;
  backoff_.Reset();
  while (!flags_.Stopping()) {
    auto reply =
        client_->Join(ModelSpecOf(config_.model), static_cast<int32_t>(config_.workers.threads), config_.workers.device,
                      joined_ ? join_.shard_index() : first_shard_hint_, static_cast<int32_t>(config_.comm.fragments),
                      cluster_size_, joined_ ? join_.shard_reader() : -1,
                      config_.comm.cluster_parts && cluster_size_ > 1 ? cluster_size_ : 1, data_);
    ProtocolState state = protocol_;
    state.connect_deadline_passed = Now() > deadline;
    const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kJoin, reply.status(), state);
    if (decision.action == ProtocolAction::kProceed) {
      const JoinCheck check = CheckJoinedRun(
          config_, {reply->inner_steps(), reply->rounds_total(), reply->chunk_bytes(), reply->max_message_bytes()});
      if (!check.refusal.empty()) {  // a member now: leave at once, so that no round waits for it
        client_->Leave("its config differs from the coordinator's").IgnoreError();
        return WorkerError(kWorkerConfigError, check.refusal);
      }
      for (const std::string& warning : check.warnings) {  // once each (a rejoin would say them again)
        if (join_warned_.insert(warning).second) spdlog::warn("{}", warning);
      }
      AcceptJoin(*std::move(reply));
      return absl::OkStatus();
    }
    if (decision.action != ProtocolAction::kRetry) {
      return WorkerError(static_cast<WorkerExit>(decision.exit_code), decision.reason);
    }
    if (!decision.hint.empty() && !hinted)
      spdlog::warn("coordinator {}: {}; retrying", protocol_.coordinator, decision.hint);
    hinted = hinted || !decision.hint.empty();
    if (!warned) {  // the first answer's words: a user who pointed the worker at the wrong port sees why at once
      spdlog::info("waiting for coordinator {} ({}); retrying for workers.connect_timeout_s = {} s",
                   protocol_.coordinator, std::string(reply.status().message()), protocol_.connect_timeout_s);
    }
    warned = true;
    backoff_.Sleep(flags_.stop);
  }
  return WorkerError(kWorkerInterrupted,
                     absl::StrCat("asked to stop before joining coordinator ", protocol_.coordinator, "; leaving"));
}

void CoordinatorSession::AcceptJoin(JoinReply reply) {
  if (joined_ && reply.shard_index() != join_.shard_index()) {
    spdlog::warn("rejoined with shard {} instead of {}; this worker keeps reading shard {}", reply.shard_index(),
                 join_.shard_index(), join_.shard_index());
    reply.set_shard_index(join_.shard_index());
  }
  if (joined_ && reply.shard_reader() != join_.shard_reader()) {  // its sampler is seeded: it keeps its windows
    spdlog::warn("rejoined as reader {} of shard {} instead of {}; this worker keeps drawing reader {}'s windows",
                 reply.shard_reader(), join_.shard_index(), join_.shard_reader(), join_.shard_reader());
    reply.set_shard_reader(join_.shard_reader());
  }
  join_ = std::move(reply);
  joined_ = true;
  spdlog::info("joined {} at round {}: shard {}/{}{}; pushes over {}", protocol_.coordinator, join_.round() + 1,
               join_.shard_index(), join_.shard_count(),
               join_.shard_reader() > 0
                   ? absl::StrCat(" (shared with other members: reader ", join_.shard_reader(), ", its own windows)")
                   : std::string(),
               join_.push_port() > 0 ? absl::StrCat("tcp to port ", join_.push_port()) : std::string("grpc"));
}

bool CoordinatorSession::Rejoin() {
  absl::Status joined = Join();
  // Asked to go while joining again: failure_ stays OK, as for a signal anywhere else mid-run (exit 0, not 130).
  if (!joined.ok() && flags_.Stopping()) return false;
  failure_ = std::move(joined);
  return failure_.ok();
}

bool CoordinatorSession::TakeKeepLocal() {
  const bool keep = keep_local_;
  keep_local_ = false;
  return keep;
}

bool CoordinatorSession::TakeFullPull() { return std::exchange(full_pull_, false); }

CoordinatorSession::Outcome CoordinatorSession::GiveUp(const ProtocolDecision& decision, const std::string& prefix) {
  failure_ = WorkerError(static_cast<WorkerExit>(decision.exit_code), absl::StrCat(prefix, decision.reason));
  return Outcome::kGiveUp;
}

bool CoordinatorSession::CoordinatorGone(const std::string& last_error) {
  const double silent = client_->seconds_since_answer();
  if (silent <= config_.workers.connect_timeout_s) return false;
  ProtocolDecision d;
  d.action = ProtocolAction::kGiveUp;
  d.exit_code = kWorkerUnreachable;
  d.reason = absl::StrCat("coordinator ", protocol_.coordinator, " has not answered for ", static_cast<int64_t>(silent),
                          " s (workers.connect_timeout_s = ", config_.workers.connect_timeout_s, " s): ", last_error);
  GiveUp(d);
  return true;
}

bool CoordinatorSession::PushUntilCounted(int64_t round, const RoundResult& result) {
  backoff_.Reset();
  bool need_push = true;
  push_counted_ = false;
  bool announced = false;  // on_counted_ called for this push (a re-push after a restarted aggregation is the same)
  while (!flags_.Stopping()) {
    Outcome outcome = Outcome::kGoOn;
    if (need_push) {
      outcome = PushOnce(round, result, &need_push);
    } else {
      if (flags_.drain) break;
      // The coordinator holds the heartbeat until the round closes (or a second passes), so the close is seen as
      // it happens; one that answers at once (an older coordinator, a state that is not held) is asked again after
      // the poll interval.
      const double asked = Now();
      outcome = AwaitRound(round, &need_push);
      const double left = kAwaitPollS - (Now() - asked);
      if (outcome == Outcome::kGoOn && !need_push && left > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(left));
      }
    }
    push_counted_ = !need_push;
    if (push_counted_ && !announced && outcome == Outcome::kGoOn && on_counted_) {
      announced = true;
      on_counted_(round);
    }
    if (outcome != Outcome::kGoOn) return outcome == Outcome::kRoundOver;
  }
  failure_ = absl::OkStatus();  // asked to go (signal or drain): a clean leave
  return false;
}

CoordinatorSession::Outcome CoordinatorSession::PushOnce(int64_t round, const RoundResult& result, bool* need_push) {
  const double t0 = Now();
  auto pushed = part_push_ ? part_push_(round, result) : client_->Push(round, result);
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
      if (WaitAfterRefusal(round) == WaitAction::kRepush) {  // the round still waits for this push: once more
        keep_local_ = false;
        repushed_after_refusal_ = round;
        return Outcome::kGoOn;  // *need_push stays true
      }
      return Outcome::kRoundOver;   // the round moved on: pull the new parameters
    case ProtocolAction::kCounted:  // a resend after a lost reply: the first push counted
      spdlog::info("round {}: {}", round + 1, decision.reason);
      *need_push = false;
      return Outcome::kGoOn;
    case ProtocolAction::kRejoin:  // then push again
      return Rejoin() ? Outcome::kGoOn : Outcome::kGiveUp;
    case ProtocolAction::kRepush:
      return Outcome::kGoOn;
    case ProtocolAction::kRetry:
      if (CoordinatorGone(decision.reason)) return Outcome::kGiveUp;
      spdlog::warn("round {}: {}", round + 1, decision.reason);
      backoff_.Sleep(flags_.stop);
      return Outcome::kGoOn;
    case ProtocolAction::kGiveUp:
      break;
  }
  return GiveUp(decision, absl::StrCat("round ", round + 1, ": "));
}

WaitAction CoordinatorSession::WaitAfterRefusal(int64_t round, bool announced) {
  bool logged = announced;
  while (!flags_.Stopping()) {
    auto beat = client_->Heartbeat(round);
    if (!beat.ok()) return WaitAction::kRoundClosed;
    // A quarantined worker (its push had the largest norm of a round whose step was not finite) goes on from the
    // whole global model, whatever outer.late_policy says: its local parameters made that push.
    if (beat->quarantined_until_round() > beat->round()) {
      keep_local_ = false;
      full_pull_ = true;
    }
    const WaitDecision wait = DecideAfterRefusal(HeartbeatViewOf(*beat), round, config_.outer.mode == OuterMode::kAsync,
                                                 repushed_after_refusal_ == round);
    if (wait.action == WaitAction::kRepush) {
      spdlog::info("round {}: {}", round + 1, wait.reason);
      return wait.action;
    }
    if (wait.action != WaitAction::kKeepWaiting) {
      // Refused again in a round that is still open: not late, so outer.late_policy does not apply.
      if (beat->round() == round && config_.outer.mode != OuterMode::kAsync) keep_local_ = false;
      if (logged) spdlog::info("waited until round {}: training again", beat->round() + 1);
      return wait.action;
    }
    if (!logged) spdlog::warn("{}", wait.reason);
    logged = true;
    for (int i = 0; i < 10 && !flags_.Stopping(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return WaitAction::kRoundClosed;
}

CoordinatorSession::Outcome CoordinatorSession::AwaitRound(int64_t round, bool* need_push) {
  auto beat = client_->Heartbeat(round, kMaxHeartbeatHoldMs);
  const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kHeartbeat, beat.status(), protocol_);
  if (decision.action == ProtocolAction::kRejoin) {
    *need_push = true;  // a restarted coordinator has not counted our push (so it is not counted if we give up)
    if (!Rejoin()) return Outcome::kGiveUp;
    return Outcome::kGoOn;
  }
  if (decision.action == ProtocolAction::kRetry) {
    if (CoordinatorGone(decision.reason)) return Outcome::kGiveUp;
    backoff_.Sleep(flags_.stop);
    return Outcome::kGoOn;
  }
  if (decision.action != ProtocolAction::kProceed) return GiveUp(decision);
  if (beat->drain()) flags_.drain = flags_.quit = true;
  const WaitDecision wait = DecideWhileWaiting(HeartbeatViewOf(*beat), round, config_.outer.mode == OuterMode::kAsync);
  if (wait.action == WaitAction::kRoundClosed) return Outcome::kRoundOver;
  if (wait.action == WaitAction::kQuarantined) {  // not counted; and not trained on from local parameters
    spdlog::warn("round {}: {}", round + 1, wait.reason);
    *need_push = true;
    keep_local_ = false;
    full_pull_ = true;
    WaitAfterRefusal(round, /*announced=*/true);
    return Outcome::kRoundOver;
  }
  if (wait.action == WaitAction::kRepush) {
    spdlog::info("round {}: {}", round + 1, wait.reason);
    *need_push = true;
  }
  return Outcome::kGoOn;
}

std::optional<PullResult> CoordinatorSession::Pull(NamedTensors& dest, int fragment, int64_t have_round) {
  if (part_pull_ && dest.empty() && fragment < 0) return PullWith(part_pull_);  // every rank its slice
  return PullWith([&]() -> absl::StatusOr<PullResult> {
    ChunkAssembler assembler(dest);
    UpdateApplier sparse(dest);
    bool touched = false;
    auto pulled = client_->Pull(assembler, fragment, have_round, &sparse, &touched);
    if (touched) have_round = -1;  // after a failure with chunks dest may be torn: the next attempt pulls all of it
    return pulled;
  });
}

std::optional<PullResult> CoordinatorSession::PullWith(const std::function<absl::StatusOr<PullResult>()>& once) {
  backoff_.Reset();
  while (!flags_.Stopping()) {
    auto pulled = once();
    const ProtocolDecision decision = DecideOnStatus(ProtocolCall::kPull, pulled.status(), protocol_);
    if (decision.action == ProtocolAction::kProceed) {
      if (pulled->sparse) {
        spdlog::info("round {}: sparse pull, {} changed values in {} bytes; theta hash {:016x} as the coordinator's",
                     pulled->round, pulled->changed, pulled->bytes, pulled->theta_hash);
      }
      return *pulled;
    }
    if (decision.action == ProtocolAction::kRejoin) {
      if (!Rejoin()) return std::nullopt;
      continue;
    }
    if (decision.action != ProtocolAction::kRetry) {
      GiveUp(decision);
      return std::nullopt;
    }
    if (CoordinatorGone(decision.reason)) return std::nullopt;
    spdlog::warn("{}", decision.reason);
    backoff_.Sleep(flags_.stop);
  }
  return std::nullopt;
}

std::optional<PullResult> CoordinatorSession::Exchange(int64_t round, const RoundResult& result,
                                                       NamedTensors& fragment_theta, int64_t have_round) {
  if (!PushUntilCounted(round, result)) return std::nullopt;
  const double t0 = Now();
  std::optional<PullResult> pulled =
      part_pull_ ? PullWith(part_pull_) : Pull(fragment_theta, result.report.fragment, have_round);
  if (pulled) spdlog::info("round {}: pulled {} bytes in {:.3f} s", round + 1, pulled->bytes, Now() - t0);
  return pulled;
}

}  // namespace diloco
