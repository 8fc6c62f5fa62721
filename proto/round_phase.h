// RoundPhase: where the coordinator's round is, the one list of phase names. The core keeps the phase as this enum;
// HeartbeatReply.phase and StatusReply.phase (proto/diloco.proto, strings on the wire) are filled from kRoundPhases,
// and the diloco_phase metric (coordinator/metrics_text.cc) emits one series per entry, so its label set is fixed.
// Adding a phase: one enumerator and one table row. Constant data; thread-safe.
#pragma once

#include <array>
#include <string_view>
#include <utility>

namespace diloco {

enum class RoundPhase {
  kTraining,   // a round is open: pushes are folded into it
  kStepping,   // the round is closing: the outer step runs, pushes wait (async: retry)
  kFinishing,  // the last round is stepped; its evaluation, checkpoint and summary are being written
  kComplete,   // the run is over; workers leave
};

// Every phase with its wire name, in declaration order.
inline constexpr std::array<std::pair<RoundPhase, std::string_view>, 4> kRoundPhases{{
    {RoundPhase::kTraining, "training"},
    {RoundPhase::kStepping, "stepping"},
    {RoundPhase::kFinishing, "finishing"},
    {RoundPhase::kComplete, "complete"},
}};

// The wire name of `phase` ("" for a value outside the table, which a cast could make).
constexpr std::string_view RoundPhaseName(RoundPhase phase) {
  for (const auto& [p, name] : kRoundPhases) {
    if (p == phase) return name;
  }
  return "";
}

}  // namespace diloco
