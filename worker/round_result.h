// RoundResult: what a worker pushes for a round: the pseudo-gradient of the round's fragment and the round's report
// (worker/round_report.h). Built by the worker's Pack (or InnerTrainer::TrainRound), read by the client's Push.
// Plain data: one owner at a time (the worker's exchange reads it while the inner loop trains on).
#pragma once

#include "proto/named_tensors.h"
#include "worker/round_report.h"

namespace diloco {

struct RoundResult {
  NamedTensors pseudo_gradient;  // float32 CPU tensors, parameter order (one fragment's with comm.fragments > 1)
  RoundReport report;
};

}  // namespace diloco
