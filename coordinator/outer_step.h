// OuterStep: the outer update the coordinator applies when a round closes, theta_t = OuterOpt(theta_{t-1}, delta)
// (DiLoCo, arXiv 2311.08105, Algorithm 1, line 12), behind one interface so the core never asks which one it holds.
// Implementations: OuterOptimizer (outer_optimizer.h: PyTorch's SGD with Nesterov or plain momentum; lr 1 without
// momentum is FedAvg) and DelayedNesterov (delayed_nesterov.h: asynchronous rounds, arXiv 2401.09135). MakeOuterStep
// chooses one from the config, once, at start-up.
// Shapes: theta and delta are lists of float32 tensors with matching shapes, in parameter order.
// Each implementation owns its momentum state. Not thread-safe: the coordinator's round thread alone calls Step().
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "config/config.h"

namespace diloco {

// Thrown by an outer step whose result (theta_t or the momentum) would hold a NaN or an Inf: nothing was committed
// (theta and the momentum keep their values), so the caller can discard the round and redo it (issue 32 item 4).
class NonFiniteStep : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The state of an outer step (its momentum, and any buffers and counters) as tensor handles, taken before a step
// to undo it when the step's result is refused after the step returned (the evaluation guard, theta_store.h,
// issue 32 item 4). Step() never writes its state in place, so restoring the handles undoes it exactly; after
// StepInPlace the caller writes the momentum's values back first (theta_store.h's spill).
struct OuterStepState {
  std::vector<std::vector<at::Tensor>> buffers;  // per implementation: {momentum} or {m, acc}
  int64_t arrivals = 0;                          // Delayed Nesterov's arrival count
};

class OuterStep {
 public:
  virtual ~OuterStep() = default;

  // theta_t in tensors other than `theta`, which is left untouched (pulls in flight may still read it).
  // `recycle`: tensors the caller no longer needs (e.g. theta_{t-2}) that an implementation may overwrite with the
  // result; `only`: the positions to step (one fragment of Streaming DiLoCo), nullptr for all. An implementation
  // that cannot honour `only` refuses it (std::invalid_argument). A result that would not be finite throws
  // NonFiniteStep with the state (the momentum) as it was.
  virtual std::vector<at::Tensor> Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                                       std::vector<at::Tensor> recycle, const std::vector<size_t>* only) = 0;
  // theta_t written over theta_{t-1} (and the momentum updated in place): the synchronous coordinator's step, which
  // keeps one copy of theta and serves pulls from it under a ThetaGuard (theta_store.h). Checks every tensor before it
  // writes any, so a refusal (std::invalid_argument) leaves theta and the momentum as they were; so does
  // NonFiniteStep (theta_t or the momentum would hold a NaN or an Inf: a read-only pass computes the result first, no
  // extra copy of the model). An implementation without an in-place form throws std::logic_error (the asynchronous
  // Delayed Nesterov: the core uses Step there).
  virtual void StepInPlace(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                           const std::vector<size_t>* only) {
    (void)theta, (void)delta, (void)only;
    throw std::logic_error("this outer step has no in-place form");
  }
  // Allocates and faults in the state the first step needs (momentum buffers shaped like theta), so the first
  // round's step costs what later ones do. Does not change momentum_buffers(). Default: nothing to prepare.
  virtual void Reserve(const std::vector<at::Tensor>& theta) { (void)theta; }
  // The momentum state, for checkpoints (empty before it exists). Never modified in place once returned, so a copy
  // of the vector stays valid while later steps run.
  virtual const std::vector<at::Tensor>& momentum_buffers() const = 0;
  // Restores the momentum state from a checkpoint (empty, or one tensor per parameter).
  virtual void set_momentum_buffers(std::vector<at::Tensor> buffers) = 0;
  // The state before a step, and its restore (OuterStepState). Default: the momentum buffers.
  virtual OuterStepState SaveState() const { return {{momentum_buffers()}, 0}; }
  virtual void RestoreState(OuterStepState state) { set_momentum_buffers(std::move(state.buffers.at(0))); }
};

// The outer step of `config`: Delayed Nesterov for outer.mode async with outer.optimizer nesterov (N = outer.delay_n,
// or workers.count when 0), else OuterOptimizer(outer.optimizer, outer.lr, outer.momentum).
std::unique_ptr<OuterStep> MakeOuterStep(const Config& config);

}  // namespace diloco
