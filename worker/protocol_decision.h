// The worker's protocol decisions: what to do after each call to the coordinator, as pure functions of (call, gRPC
// status, state) returning an action and a reason (the line the worker logs). The worker's CoordinatorSession
// (worker/coordinator_session.h) follows them; tests/unit/protocol_decision_test.cc asserts on both for every code the
// coordinator documents (docs/operations.md "Errors a push can get"). No clock, no network: the caller says whether the
// connect deadline has passed. Thread-safe (pure functions).
//
// By call (the status codes the coordinator sends, docs/operations.md "Errors a push can get"):
//   any call   UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN: transient, retry after the backoff (Join: until
//              workers.connect_timeout_s, unless this worker's own TLS check failed)
//   Push       FAILED_PRECONDITION: the round moved on (late push, or the run is complete): pull the new round
//              (outer.late_policy reuse_local keeps the local parameters); ALREADY_EXISTS: already counted, wait;
//              ABORTED: the round's aggregation restarted, push again now; NOT_FOUND: join again, push again
//   Pull       NOT_FOUND: join again, pull again
//   Heartbeat  NOT_FOUND: join again, push again (a restarted coordinator has not counted the push)
//   otherwise  give up with exit code 3 (kWorkerRefused)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"
#include "config/config_enums.h"

namespace diloco {

enum class ProtocolCall { kJoin, kPush, kPull, kHeartbeat };

enum class ProtocolAction {
  kProceed,    // the call succeeded (Join: joined; Push: counted, wait for the round; Pull: use it; Heartbeat: read it)
  kRetry,      // transient failure: sleep the backoff, call again
  kRejoin,     // the coordinator does not know this worker: Join again, then repeat (Heartbeat: push again)
  kRepush,     // Push ABORTED: the round's aggregation restarted; push again at once
  kCounted,    // Push ALREADY_EXISTS: the push is counted already; wait for the round
  kNextRound,  // Push FAILED_PRECONDITION: not counted, the round moved on; pull the new global parameters
  kGiveUp,     // stop the worker with exit_code
};

// What the decision depends on besides the status.
struct ProtocolState {
  std::string coordinator;  // HOST:PORT (named in the reasons)
  std::string worker_id;
  bool tls = false;  // security.tls_ca or tls_cert set
  LatePolicy late_policy = LatePolicy::kDrop;
  double connect_timeout_s = 0;          // workers.connect_timeout_s (named in the reason)
  bool connect_deadline_passed = false;  // Join: connect_timeout_s has passed since the first attempt
};

struct ProtocolDecision {
  ProtocolAction action = ProtocolAction::kProceed;
  std::string reason;       // for the log; Push reasons are logged after "round N: "
  int exit_code = 0;        // kGiveUp: the worker's exit code (worker/worker_options.h WorkerExit)
  bool keep_local = false;  // kNextRound: continue from the local parameters (late_policy reuse_local)
  std::string hint;         // Join kRetry: a hint about TLS to log once (TlsHint), "" if none
};

ProtocolDecision DecideOnStatus(ProtocolCall call, const absl::Status& status, const ProtocolState& state);

// The coordinator's heartbeat reply, as far as a worker waiting for its round to close reads it.
struct HeartbeatView {
  int64_t round = 0;    // the coordinator's open round
  bool pushed = false;  // this worker's push for it is counted (async: still pending)
  bool run_complete = false;
  int64_t quarantined_until_round = 0;  // > round: this worker's pushes are refused until then
  // The base of this worker's newest applied push (-1: none); nullopt: the coordinator does not say (an older one).
  std::optional<int64_t> last_applied_base;
  std::string phase;  // training | stepping | finishing | complete (proto/round_phase.h); "" from an older coordinator
};

enum class WaitAction {
  kKeepWaiting,  // the round is still open and the push counted: heartbeat again
  kRoundClosed,  // pull: the round moved past `round` (async: the push was applied) or the run is complete
  kRepush,       // the coordinator restarted the round's aggregation: push again
  kQuarantined,  // the push was discarded and this worker is quarantined: wait until the round named, then pull
};

struct WaitDecision {
  WaitAction action = WaitAction::kKeepWaiting;
  std::string reason;
};

// After a push for `round` (0-based) was counted: what a heartbeat reply means. `async`: outer.mode async. A push no
// longer held while the heartbeat names a quarantine (its round's step was discarded as non-finite and this worker's
// push had the largest norm) is not pushed again: it would be refused.
WaitDecision DecideWhileWaiting(const HeartbeatView& beat, int64_t round, bool async);

// After a push for `refused_round` (0-based) was refused with FAILED_PRECONDITION (late, or this worker is
// quarantined): whether to train the next round now (kRoundClosed) or heartbeat (kKeepWaiting) until the quarantine
// ends (training now would be refused and its inner steps lost) or, in sync mode, until the round's outer step is
// done (a push refused while the round steps: a pull before the step ends gives that round's theta again, and the
// worker would train the round it was just refused for). A sync coordinator still at `refused_round` and training
// (its heartbeat's phase) refused the push for another reason than the close: the open round waits for this worker,
// so it does not wait. It pushes the same result again once (kRepush: a push cut as late while the round was due to
// close, or one refused while a step that was then discarded ran, counts now) and, refused again (`repushed`; e.g.
// computed against a theta of that round from before a coordinator restart), pulls now (kRoundClosed).
WaitDecision DecideAfterRefusal(const HeartbeatView& beat, int64_t refused_round, bool async, bool repushed = false);

// The run settings a JoinReply states (0: not said, an older coordinator), as far as this worker checks its own
// config against them.
struct JoinedRun {
  int64_t inner_steps = 0;        // the coordinator's inner.steps
  int64_t rounds_total = 0;       // outer.rounds x comm.fragments
  int64_t chunk_bytes = 0;        // the coordinator's comm.chunk_bytes (pulls come in its chunks)
  int64_t max_message_bytes = 0;  // the largest message it accepts (MaxMessageBytes of its chunk_bytes)
};

// After a Join: why this worker must not train under its config (`refusal`, the one line to exit with; "" when it
// may) and what it trains differently from the run (`warnings`, one line each; a slower or faster member is allowed):
//   comm.chunk_bytes       refusal when one side's chunks would exceed the other's message limit (chunk + 1 MiB, less
//                          a 64 KiB margin for the chunk's header): a pull or a push would be refused mid-run
//   inner.steps differs    warning: its pseudo-gradients are of another H (weighed by their tokens), and an H that
//                          outlasts coordinator.round_timeout_s is late every round
//   rounds differ          warning: the inner learning-rate schedule follows this worker's outer.rounds (after a
//                          coordinator restarted with more rounds, say); restart it with the coordinator's config
struct JoinCheck {
  std::string refusal;
  std::vector<std::string> warnings;
};
JoinCheck CheckJoinedRun(const Config& config, const JoinedRun& run);

// The rounds in a row whose push of this worker did not count (it came after its round closed, or was refused): a
// worker whose rounds outlast the others' (slower hardware, a larger inner.steps) is late every round and contributes
// nothing, with one "push not counted" line a round. Note returns one warning line that says so and what to change
// when the run reaches kWarnAfter rounds, and again every kWarnEvery after; "" otherwise. A counted push ends the run.
// Not thread-safe (the worker's main thread).
class UncountedStreak {
 public:
  static constexpr int64_t kWarnAfter = 3;
  static constexpr int64_t kWarnEvery = 10;
  // After the push of round `round` (0-based): whether it counted.
  std::string Note(int64_t round, bool counted);

 private:
  int64_t in_a_row_ = 0;
};

}  // namespace diloco
