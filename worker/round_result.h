// RoundResult: what a worker pushes for a round: the pseudo-gradient of the round's fragment and the round's report
// (worker/round_report.h). Built by the worker's Pack (or InnerTrainer::TrainRound), read by the client's Push.
// Plain data: one owner at a time (the worker's exchange reads it while the inner loop trains on).
#pragma once

#include <vector>

#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"
#include "worker/round_report.h"

namespace diloco {

struct RoundResult {
  NamedTensors pseudo_gradient;  // float32 CPU tensors, parameter order (one fragment's with comm.fragments > 1)
  RoundReport report;
  // The push's wire chunks when error feedback already encoded them (comm.codec topk: encoded once per round,
  // worker/error_feedback.h); empty: the client encodes pseudo_gradient.
  std::vector<TensorChunk> encoded;
};

}  // namespace diloco
