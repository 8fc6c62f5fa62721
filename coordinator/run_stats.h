// RunStats: the run's counters (bytes received, sent and committed, tokens committed, the data-parallel equivalent)
// and the last round's timings; CreditRound books a committed round into them and into its contributors' members.
// BuildStatusReply: the Status RPC's reply (also /status.json, /metrics and summary.json) from the core's state.
// Not thread-safe: RunStats is a plain value that CoordinatorCore guards with its mutex; BuildStatusReply is a pure
// function of its arguments (the caller holds whatever lock guards them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "coordinator/membership.h"
#include "coordinator/round_state.h"
#include "proto/checkpoint.h"
#include "proto/diloco.pb.h"

namespace diloco {

struct RunStats {
  int64_t bytes_received = 0;          // every chunk folded, committed or not
  int64_t bytes_sent = 0;              // parameter chunks sent to pulls
  int64_t bytes_pushed_committed = 0;  // pushes of committed rounds
  int64_t tokens_committed = 0;        // tokens of the committed rounds (all workers)
  int64_t dp_equivalent_bytes = 0;     // what ring all-reduce every inner step would have sent for them
  int64_t last_round_bytes_pushed = 0;
  double last_round_seconds = 0;
  double last_outer_step_seconds = 0;

  // A committed round of `contributors` over a model of `num_params` parameters: credits each contributor's member
  // (rounds, tokens, bytes, measured steps/s) and the totals. Members that have gone are skipped.
  void CreditRound(const RoundState::Pushes& contributors, int64_t num_params, Membership& membership);
};

// What the Status reply reads besides the counters: the core's fixed facts and its state under the lock.
struct StatusSources {
  const Config& config;
  int64_t round = 0;  // completed outer steps (the published theta)
  int fragments = 1;
  int64_t params = 0;
  const std::string& fingerprint;
  const RoundState& round_state;
  const RunStats& stats;
  const Membership& membership;
  const std::vector<EvalRecord>& evals;
};
StatusReply BuildStatusReply(const StatusSources& sources, double now);

}  // namespace diloco
