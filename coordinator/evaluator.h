// Evaluator: what the coordinator core knows of evaluation, a function theta -> validation loss (nats/token). The
// core holds one and calls it on the round thread after a round closes (coordinator.eval_every); the model host
// (model_host.h) builds the real one over the model and the validation token shard, tests pass a fake.
// Also NamedTensors and ParamSnapshot, the plain-tensor form of theta the core is built from and publishes.
// An Evaluator is called from one thread at a time (the core's round thread); it need not be thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace diloco {

// Parameters by name, in the model's parameter order (float32 for theta).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// theta_round as published to pulls: immutable once published (shared by every pull in flight).
struct ParamSnapshot {
  int64_t round = 0;
  bool complete = false;
  NamedTensors params;  // theta_round, float32, never modified once published
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // The validation loss of `theta` (same names and shapes as theta_0). May throw: the core logs the failure and
  // training goes on without that evaluation.
  virtual double Evaluate(const NamedTensors& theta) = 0;
};

}  // namespace diloco
