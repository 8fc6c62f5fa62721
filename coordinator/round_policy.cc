#include "coordinator/round_policy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace diloco {

RoundDecision DecideRoundClose(const RoundView& round, double now, const RoundPolicyOptions& options) {
  const int64_t pushed = static_cast<int64_t>(round.pushed.size());
  std::vector<std::string> missing;
  for (const std::string& id : round.active) {
    if (round.pushed.count(id) == 0) missing.push_back(id);
  }
  const double age = now - round.opened_at;
  if (pushed < options.min_workers) {
    return {false, absl::StrCat("waiting for pushes: ", pushed, " of min_workers ", options.min_workers,
                                " received (", round.active.size(), " active)")};
  }
  if (missing.empty()) {
    return {true, absl::StrCat("all ", round.active.size(), " active members pushed")};
  }
  if (age >= options.round_timeout_s) {
    return {true, absl::StrCat("round_timeout_s ", options.round_timeout_s, " reached with ", pushed,
                               " pushes; not waiting for ", absl::StrJoin(missing, ", "))};
  }
  return {false, absl::StrCat("waiting for ", absl::StrJoin(missing, ", "), " (", pushed, " pushed, timeout in ",
                              static_cast<int64_t>(options.round_timeout_s - age), " s)")};
}

}  // namespace diloco
