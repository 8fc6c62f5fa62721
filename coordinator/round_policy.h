// When does an open round close? A pure function of who is active, who has pushed, how long the round has been
// open, and the options; it returns the decision and the reason, which status shows and the log prints once.
//   close if pushed >= min_workers and every active member has pushed;
//   close if pushed >= needed and the round is older than round_timeout_s, where needed = PushesNeeded: min_workers,
//   less the active members quarantined for the round when without them min_workers cannot be reached (they may
//   not push before it closes: past the timeout, waiting for them would wait forever), at least 1;
//   otherwise wait (never close with fewer than min_workers pushes before the timeout, nor fewer than `needed`).
// Beside it, the other pure rules of the round, each (state[, now], options) -> decision + reason:
//   DecideAsyncClose: outer.mode async closes a version as soon as a push has committed and none is streaming;
//   HoldForPartialPushes: a close waits while a push is part-folded into the sums (never step on half a push);
//   DecidePushRound: which round a push may be for (sync: the open one; async: at most outer.max_staleness behind);
//   QuarantineRounds: how long a member whose pushes keep breaking off is refused.
// The rules that differ between outer.mode sync and async are chosen here, from the mode (DecideCloseOf,
// StreamsHoldClose, LogsWaitReasons, PushRoundOptionsOf): the core never branches on the mode itself.
//
// Broken pushes. Chunks are folded into the one round accumulator as they arrive (no per-worker copy: the coordinator
// holds at most 3.5 model copies, coordinator.h "Memory"), so a push that breaks off after folding cannot be taken
// out exactly (that would need a copy of its part or a second accumulator): the round's aggregation restarts and the
// counted workers push again (their heartbeats say pushed=false). To keep one broken or hostile member from making
// that happen forever, a member's broken pushes are counted (strikes, reset by a counted push) and it is quarantined:
// its pushes are refused (FAILED_PRECONDITION) and no close waits for it. And no open stream holds a close forever:
// when a close is due, a push stream that made no progress for coordinator.lease_s or has been open longer than
// coordinator.round_timeout_s is cut as late (if it had folded chunks, the aggregation restarts once and its member
// is quarantined at once); a stream that folded nothing never holds a close.
// Thread-safe (no state).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"
#include "proto/round_phase.h"

namespace diloco {

struct RoundView {
  std::vector<std::string> active;  // active member ids
  std::set<std::string> pushed;     // ids whose push for this round is counted (may include now-lost members)
  double opened_at = 0;             // seconds, same clock as `now`
  size_t quarantined = 0;           // active members quarantined for this round (not in `active`)
};

struct RoundPolicyOptions {
  int64_t min_workers = 1;
  double round_timeout_s = 600;
};

struct RoundDecision {
  bool close = false;
  std::string reason;
};

RoundDecision DecideRoundClose(const RoundView& round, double now, const RoundPolicyOptions& options);
// The pushes a round past round_timeout_s needs before it may close: min_workers when `could_push` (the pushes counted
// and the unquarantined active members yet to push) reach it, else max(1, could_push, min_workers - quarantined):
// every member that may push must, and a shortfall beyond the quarantined still waits (a member may join).
int64_t PushesNeeded(int64_t min_workers, size_t quarantined, size_t could_push);

// outer.mode async: each version closes once at least one push has committed and no push stream is open (pushes
// that commit together are averaged into one arrival).
struct AsyncRoundView {
  size_t pushed = 0;     // pushes committed against the open version
  size_t streaming = 0;  // push streams open
};
RoundDecision DecideAsyncClose(const AsyncRoundView& round);

// A close decision turned into a wait while `partial` pushes have some chunks folded and have not committed (their
// chunks are in the sums, so stepping now would apply part of a pseudo-gradient). Other decisions pass unchanged.
RoundDecision HoldForPartialPushes(const RoundDecision& decision, size_t partial);

// The round a push may be for. Sync: exactly the open round (the one based on `version`), while the phase is
// training. Async: any version from `version - max_staleness` to `version`, while training; while stepping the push
// is told to retry, while the last version is finished it is refused (the run ends). Returns OK to accept, else the
// refusal (code + reason) the worker gets.
struct PushRoundView {
  int64_t version = 0;     // completed outer steps: the round of the published theta
  int64_t push_round = 0;  // the round the push was computed against (its RequestMeta.round)
  RoundPhase phase = RoundPhase::kTraining;
};
struct PushRoundOptions {
  bool async = false;         // outer.mode async
  int64_t max_staleness = 0;  // outer.max_staleness (async only)
};
absl::Status DecidePushRound(const PushRoundView& push, const PushRoundOptions& options);

// outer.mode's push rule options (outer.max_staleness applies to async only).
PushRoundOptions PushRoundOptionsOf(const Config& config);

// What the close rules of either mode read of the open round.
struct CloseView {
  RoundView members;        // sync: the unquarantined active members, the counted pushes, when the round opened
  AsyncRoundView arrivals;  // async: pushes committed and streams open
};
// The close rule of `mode` before open streams are considered: sync DecideRoundClose, async DecideAsyncClose.
RoundDecision DecideCloseOf(OuterMode mode, const CloseView& view, double now, const RoundPolicyOptions& options);
// Whether open push streams hold `decision` (then the stalled ones are cut and the rule is asked again). Sync: a
// close is due and `partial` pushes have chunks in the sums; async: streams are open while pushes have arrived.
bool StreamsHoldClose(OuterMode mode, const RoundDecision& decision, const CloseView& view, size_t partial);
// Whether a wait reason is logged when it changes: sync yes; async no (it changes with every push).
bool LogsWaitReasons(OuterMode mode);

// Rounds a member is quarantined for after a broken push, given its strikes (broken pushes since its last counted
// one, this one included) and whether the coordinator cut the push as stalled. A first break is forgiven (a network
// blip: the worker pushes again), except a stall, which held a due close; then 1, 2, 4, ... rounds, at most
// kMaxQuarantineRounds. 0: not quarantined.
inline constexpr int64_t kMaxQuarantineRounds = 16;
int64_t QuarantineRounds(int64_t strikes, bool cut_as_stalled);

}  // namespace diloco
