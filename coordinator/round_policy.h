// When does an open round close? A pure function of who is active, who has pushed, how long the round has been
// open, and the options; it returns the decision and the reason, which status shows and the log prints once.
//   close if pushed >= min_workers and every active member has pushed;
//   close if pushed >= min_workers and the round is older than round_timeout_s;
//   otherwise wait (never close with fewer than min_workers pushes).
// Thread-safe (no state).
#pragma once

#include <set>
#include <string>
#include <vector>

namespace diloco {

struct RoundView {
  std::vector<std::string> active;  // active member ids
  std::set<std::string> pushed;     // ids whose push for this round is counted (may include now-lost members)
  double opened_at = 0;             // seconds, same clock as `now`
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

}  // namespace diloco
