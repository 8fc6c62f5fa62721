// Evaluator: what the coordinator core knows of evaluation, a function theta -> validation loss (nats/token). The
// core's evaluation sink (round_sinks.h) holds one and calls it on the round thread after a round commits
// (coordinator.eval_every); the model host (model_host.h) builds the real one over the model and the validation token
// shard, tests pass a fake. theta's published form (ParamSnapshot) and its guard live in theta_store.h.
// An Evaluator is called from one thread at a time (the core's round thread); it need not be thread-safe. It reads
// theta on that thread, where nothing writes it, and must not keep a reference to it after Evaluate returns.
#pragma once

#include "proto/named_tensors.h"

namespace diloco {

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // The validation loss of `theta` (same names and shapes as theta_0). May throw: the core logs the failure and
  // training goes on without that evaluation.
  virtual double Evaluate(const NamedTensors& theta) = 0;
};

}  // namespace diloco
