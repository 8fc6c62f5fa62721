#include "coordinator/round_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/peer_text.h"

namespace diloco {

RoundDecision DecideRoundClose(const RoundView& round, double now, const RoundPolicyOptions& options) {
  const int64_t pushed = static_cast<int64_t>(round.pushed.size());
  std::vector<std::string> missing;
  for (const std::string& id : round.active) {
    if (round.pushed.count(id) == 0) missing.push_back(id);
  }
  const double age = now - round.opened_at;
  const bool timed_out = age >= options.round_timeout_s;
  const size_t could_push = round.pushed.size() + missing.size();  // counted, and active members yet to push
  const int64_t needed =
      timed_out ? PushesNeeded(options.min_workers, round.quarantined, could_push) : options.min_workers;
  if (pushed < needed) {
    const std::string excused = needed < options.min_workers
                                    ? absl::StrCat(" less ", options.min_workers - needed, " quarantined")
                                    : std::string();
    std::string reason = absl::StrCat("waiting for pushes: ", pushed, " of min_workers ", options.min_workers, excused,
                                      " received (", round.active.size(), " active)");
    // Past the timeout with too few members to ever close: say so once (the reason changes, so it is logged).
    if (timed_out && static_cast<int64_t>(could_push) < needed) {
      absl::StrAppend(&reason,
                      "; round_timeout_s passed and fewer members than min_workers can push: the round waits "
                      "until a worker joins (diloco-worker --coordinator ... --id ...)");
    }
    return {false, reason};
  }
  if (missing.empty()) {
    return {true, absl::StrCat("all ", round.active.size(), " active members pushed")};
  }
  if (timed_out) {
    return {true, absl::StrCat("round_timeout_s ", options.round_timeout_s, " reached with ", pushed,
                               " pushes; not waiting for ", Truncated(absl::StrJoin(missing, ", "), 512))};
  }
  return {false, absl::StrCat("waiting for ", Truncated(absl::StrJoin(missing, ", "), 512), " (", pushed,
                              " pushed, timeout in ", static_cast<int64_t>(options.round_timeout_s - age), " s)")};
}

int64_t PushesNeeded(int64_t min_workers, size_t quarantined, size_t could_push) {
  const auto could = static_cast<int64_t>(could_push);
  if (could >= min_workers) return min_workers;  // the others can make it up
  // Short: every member that may push must, and a shortfall beyond the quarantined still waits (a member may join).
  return std::max<int64_t>({1, could, min_workers - static_cast<int64_t>(quarantined)});
}

int64_t QuarantineRounds(int64_t strikes, bool cut_as_stalled) {
  if (strikes <= 0 || (strikes == 1 && !cut_as_stalled)) return 0;
  const int64_t doublings = std::min<int64_t>(cut_as_stalled ? strikes - 1 : strikes - 2, 4);
  return std::min<int64_t>(int64_t{1} << doublings, kMaxQuarantineRounds);
}

RoundDecision DecideAsyncClose(const AsyncRoundView& round) {
  if (round.pushed == 0) return {false, "async: waiting for a push"};
  if (round.streaming > 0) return {false, absl::StrCat("async: waiting for ", round.streaming, " push stream(s)")};
  return {true, absl::StrCat("async: ", round.pushed, " push(es) arrived")};
}

RoundDecision HoldForPartialPushes(const RoundDecision& decision, size_t partial) {
  if (!decision.close || partial == 0) return decision;
  return {false, absl::StrCat("ready to close; waiting for ", partial, " push stream(s) in flight")};
}

absl::Status DecidePushRound(const PushRoundView& push, const PushRoundOptions& options) {
  if (!options.async) {
    if (push.push_round == push.version && push.phase == RoundPhase::kTraining) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("push for round ", push.push_round + 1, " refused: the coordinator's round is ", push.version + 1,
                     " (phase ", std::string(RoundPhaseName(push.phase)), "); pull the current parameters"));
  }
  if (push.phase == RoundPhase::kFinishing || push.phase == RoundPhase::kComplete) {
    return absl::FailedPreconditionError(
        absl::StrCat("the run's last version (", push.version, ") is stepped; the run is ending"));
  }
  if (push.phase != RoundPhase::kTraining) {
    return absl::UnavailableError(
        absl::StrCat("the global model is being stepped to version ", push.version + 1, "; retry"));
  }
  const int64_t behind = push.version - push.push_round;
  if (behind < 0 || behind > options.max_staleness) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push computed against version ", push.push_round, " refused: the global model is at version ", push.version,
        " (", behind, " behind; outer.max_staleness is ", options.max_staleness, "); pull the current parameters"));
  }
  return absl::OkStatus();
}

PushRoundOptions PushRoundOptionsOf(const Config& config) {
  return {config.outer.mode == OuterMode::kAsync, config.outer.max_staleness};
}

RoundDecision DecideCloseOf(OuterMode mode, const CloseView& view, double now, const RoundPolicyOptions& options) {
  if (mode == OuterMode::kAsync) return DecideAsyncClose(view.arrivals);  // apply what has arrived
  return DecideRoundClose(view.members, now, options);
}

bool StreamsHoldClose(OuterMode mode, const RoundDecision& decision, const CloseView& view, size_t partial) {
  if (mode == OuterMode::kAsync) return view.arrivals.streaming > 0 && view.arrivals.pushed > 0;
  return decision.close && partial > 0;
}

bool LogsWaitReasons(OuterMode mode) { return mode != OuterMode::kAsync; }

}  // namespace diloco
