#include "worker/protocol_decision.h"

#include "absl/strings/str_cat.h"
#include "config/message_limit.h"
#include "proto/grpc_status.h"
#include "proto/transport_security.h"
#include "worker/worker_options.h"

namespace diloco {
namespace {

ProtocolDecision Make(ProtocolAction action, std::string reason) {
  ProtocolDecision d;
  d.action = action;
  d.reason = std::move(reason);
  return d;
}

ProtocolDecision GiveUp(int exit_code, std::string reason) {
  ProtocolDecision d = Make(ProtocolAction::kGiveUp, std::move(reason));
  d.exit_code = exit_code;
  return d;
}

ProtocolDecision DecideJoin(const absl::Status& status, const ProtocolState& state) {
  const std::string message(status.message());
  if (status.ok()) return Make(ProtocolAction::kProceed, "joined");
  if (status.code() == absl::StatusCode::kResourceExhausted) {  // coordinator.max_members: "join later"
    if (state.connect_deadline_passed) {
      return GiveUp(kWorkerRefused,
                    absl::StrCat("coordinator ", state.coordinator, " still refuses worker ", state.worker_id,
                                 " after workers.connect_timeout_s = ", state.connect_timeout_s, " s: ", message));
    }
    return Make(ProtocolAction::kRetry,
                absl::StrCat("coordinator ", state.coordinator, " is full (", message, "); retrying"));
  }
  if (!IsTransient(status)) {
    return GiveUp(kWorkerRefused,
                  absl::StrCat("coordinator ", state.coordinator, " refused worker ", state.worker_id, ": ", message));
  }
  if (state.tls && LooksLikeTlsFailure(status)) {  // this worker's own TLS check failed: retrying cannot help
    return GiveUp(kWorkerRefused,
                  absl::StrCat("TLS handshake with coordinator ", state.coordinator, " failed: ", message,
                               " (security.tls_ca must hold the CA that signed the coordinator's certificate, and the "
                               "certificate must name the address's host or security.server_name)"));
  }
  const std::string hint = TlsHint(message, state.tls);
  if (state.connect_deadline_passed) {
    return GiveUp(kWorkerUnreachable,
                  absl::StrCat("coordinator ", state.coordinator, " unreachable for workers.connect_timeout_s = ",
                               state.connect_timeout_s, " s: ", message, hint.empty() ? "" : "; ", hint));
  }
  ProtocolDecision d = Make(ProtocolAction::kRetry, absl::StrCat("coordinator ", state.coordinator,
                                                                 " not reachable yet (", message, "); retrying"));
  d.hint = hint;
  return d;
}

ProtocolDecision DecidePush(const absl::Status& status, const ProtocolState& state) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return Make(ProtocolAction::kProceed, "pushed");
    case absl::StatusCode::kFailedPrecondition: {
      const bool keep_local = state.late_policy == LatePolicy::kReuseLocal;
      ProtocolDecision d = Make(ProtocolAction::kNextRound,
                                absl::StrCat("push not counted (", message, "); ",
                                             keep_local ? "continuing from local parameters (late_policy reuse_local)"
                                                        : "restarting from the new global parameters"));
      d.keep_local = keep_local;
      return d;
    }
    case absl::StatusCode::kAlreadyExists:
      return Make(ProtocolAction::kCounted, absl::StrCat("push already counted (", message, ")"));
    case absl::StatusCode::kNotFound:
      // The coordinator does not know us (it restarted, or declared us lost): join again, then push again; if the
      // round moved on meanwhile, the push is refused as late and we pull.
      return Make(ProtocolAction::kRejoin, absl::StrCat("not a member (", message, "); joining again to push again"));
    case absl::StatusCode::kAborted:
      return Make(ProtocolAction::kRepush, absl::StrCat("push aborted (", message, "); pushing again"));
    default:
      if (IsTransient(status)) {
        return Make(ProtocolAction::kRetry, absl::StrCat("push failed (", message, "), retrying"));
      }
      return GiveUp(kWorkerRefused, absl::StrCat("push refused: ", message));
  }
}

// Pull and Heartbeat: NOT_FOUND joins again, transient codes retry, the rest give up.
ProtocolDecision DecidePullOrHeartbeat(ProtocolCall call, const absl::Status& status) {
  const std::string message(status.message());
  const bool pull = call == ProtocolCall::kPull;
  if (status.ok()) return Make(ProtocolAction::kProceed, pull ? "pulled" : "heartbeat answered");
  if (status.code() == absl::StatusCode::kNotFound) {
    return Make(ProtocolAction::kRejoin,
                absl::StrCat("not a member (", message, "); joining again to ", pull ? "pull again" : "push again"));
  }
  if (IsTransient(status)) {
    return Make(ProtocolAction::kRetry, absl::StrCat(pull ? "pull" : "heartbeat", " failed (", message, "), retrying"));
  }
  return GiveUp(kWorkerRefused, absl::StrCat(pull ? "pull" : "heartbeat", " refused: ", message));
}

}  // namespace

ProtocolDecision DecideOnStatus(ProtocolCall call, const absl::Status& status, const ProtocolState& state) {
  switch (call) {
    case ProtocolCall::kJoin:
      return DecideJoin(status, state);
    case ProtocolCall::kPush:
      return DecidePush(status, state);
    case ProtocolCall::kPull:
    case ProtocolCall::kHeartbeat:
      return DecidePullOrHeartbeat(call, status);
  }
  return GiveUp(kWorkerRefused, "unknown call");
}

WaitDecision DecideAfterRefusal(const HeartbeatView& beat, int64_t refused_round, bool async, bool repushed) {
  if (beat.run_complete) return {WaitAction::kRoundClosed, "the run is complete"};
  if (beat.quarantined_until_round > beat.round) {
    return {WaitAction::kKeepWaiting,
            absl::StrCat("quarantined through round ", beat.quarantined_until_round, " (the coordinator's round is ",
                         beat.round + 1, "): waiting instead of training pushes that would be refused")};
  }
  // (Below it: a coordinator resumed from an older checkpoint.)
  if (!async && beat.round == refused_round) {
    if (beat.phase != "training") {
      return {WaitAction::kKeepWaiting,
              absl::StrCat("round ", refused_round + 1,
                           " is closing: waiting for its outer step (a pull now would give its theta again)")};
    }
    if (!repushed) {
      return {WaitAction::kRepush, absl::StrCat("round ", refused_round + 1,
                                                " is still open and waits for this worker: pushing the same "
                                                "pseudo-gradient again")};
    }
    return {WaitAction::kRoundClosed, absl::StrCat("round ", refused_round + 1,
                                                   " is still open and refused the push again: pulling its current "
                                                   "parameters")};
  }
  return {WaitAction::kRoundClosed, "not quarantined"};
}

WaitDecision DecideWhileWaiting(const HeartbeatView& beat, int64_t round, bool async) {
  if (beat.run_complete) return {WaitAction::kRoundClosed, "the run is complete"};
  if (!beat.pushed && beat.quarantined_until_round > beat.round) {
    return {WaitAction::kQuarantined,
            absl::StrCat("the push was discarded and this worker is quarantined through round ",
                         beat.quarantined_until_round, " (the coordinator's round is ", beat.round + 1,
                         "); waiting, then pulling the global model")};
  }
  if (async) {  // our push is applied once it is no longer pending (others' may be too)
    if (beat.pushed) return {WaitAction::kKeepWaiting, "the push is pending"};
    if (beat.last_applied_base.has_value()) {  // not pending: applied, or dropped with its aggregation
      if (*beat.last_applied_base >= round) return {WaitAction::kRoundClosed, "the push was applied"};
      return {WaitAction::kRepush,
              "the coordinator no longer holds the push and has not applied it (its aggregation restarted or its step "
              "was discarded); pushing again"};
    }
    if (beat.round > round) return {WaitAction::kRoundClosed, "the push was applied"};  // an older coordinator
  } else if (beat.round > round) {
    return {WaitAction::kRoundClosed, absl::StrCat("the coordinator is at round ", beat.round + 1)};
  }
  if (!beat.pushed) return {WaitAction::kRepush, "the coordinator restarted the round's aggregation; pushing again"};
  return {WaitAction::kKeepWaiting, "the round is open and the push counted"};
}

JoinCheck CheckJoinedRun(const Config& config, const JoinedRun& run) {
  JoinCheck check;
  constexpr int64_t kHeaderMargin = int64_t{64} << 10;
  const int64_t own = config.comm.chunk_bytes;
  const bool pushes_too_big = run.max_message_bytes > 0 && own + kHeaderMargin > run.max_message_bytes;
  const bool pulls_too_big = run.chunk_bytes > 0 && run.chunk_bytes + kHeaderMargin > MaxMessageBytes(own);
  if (pushes_too_big || pulls_too_big) {
    check.refusal = absl::StrCat("comm.chunk_bytes: this worker's ", own, " and the coordinator's ", run.chunk_bytes,
                                 " differ too much: ", pushes_too_big ? "its pushes" : "the coordinator's pulls",
                                 " would exceed the other side's message limit (a chunk + 1 MiB); start the worker ",
                                 "with the coordinator's config, or --set comm.chunk_bytes=", run.chunk_bytes);
    return check;
  }
  if (run.inner_steps > 0 && run.inner_steps != config.inner.steps) {
    check.warnings.push_back(absl::StrCat(
        "inner.steps: the coordinator's run trains ", run.inner_steps, " inner steps a round and this worker's config ",
        config.inner.steps,
        ": its pseudo-gradients are of another H (weighed by their tokens), and late every round if ",
        "its rounds outlast coordinator.round_timeout_s; start it with the coordinator's config, or --set inner.steps=",
        run.inner_steps));
  }
  if (run.rounds_total > 0 && run.rounds_total != config.SyncRounds()) {
    check.warnings.push_back(absl::StrCat("outer.rounds: the coordinator's run has ", run.rounds_total,
                                          " rounds and this worker's config ", config.SyncRounds(),
                                          ": its inner learning-rate schedule follows its own; restart it with the "
                                          "coordinator's config to follow the run's"));
  }
  return check;
}

std::string UncountedStreak::Note(int64_t round, bool counted) {
  in_a_row_ = counted ? 0 : in_a_row_ + 1;
  if (in_a_row_ < kWarnAfter || (in_a_row_ - kWarnAfter) % kWarnEvery != 0) return "";
  return absl::StrCat("round ", round + 1, ": the last ", in_a_row_,
                      " pushes of this worker did not count (each came after its round closed, or was refused): its "
                      "rounds take longer than the run's. Lower its inner.steps, let the coordinator size them "
                      "(inner.adaptive_steps in the coordinator's config), or raise the coordinator's "
                      "coordinator.round_timeout_s");
}

}  // namespace diloco
