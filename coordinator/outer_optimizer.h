// OuterOptimizer: the outer step of DiLoCo (arXiv 2311.08105, Algorithm 1, line 12), applied to the averaged
// pseudo-gradient delta = sum_i w_i (theta_{t-1} - theta_i) / sum_i w_i as if it were a gradient.
// PyTorch's SGD(lr, momentum, dampening=0, nesterov), the same operations in the same order (within an ulp of it):
//   first step: buf = delta; later: buf = momentum * buf + delta
//   nesterov:   theta_t = theta_{t-1} - lr * (delta + momentum * buf)
//   sgd:        theta_t = theta_{t-1} - lr * buf          (momentum 0: - lr * delta; with lr 1 this is FedAvg)
// Shapes: theta and delta are lists of float32 CPU tensors with matching shapes (the kernels read host memory: a
// tensor on another device is refused with std::invalid_argument naming it and its device). Owns the momentum buffers.
// Implements OuterStep (outer_step.h). Not thread-safe: the coordinator's round thread alone calls Step().
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "config/config_enums.h"
#include "coordinator/outer_step.h"

namespace diloco {

class OuterOptimizer : public OuterStep {
 public:
  using Kind = OuterOptimizerKind;                    // outer.optimizer
  static Kind KindFromName(const std::string& name);  // "nesterov" | "sgd"; std::invalid_argument otherwise

  OuterOptimizer(Kind kind, double lr, double momentum);

  // Returns theta_t in tensors other than `theta`, which is left untouched (pulls in flight may still read it).
  // `recycle`: tensors the caller no longer needs (e.g. theta_{t-2}); each one nobody else holds (use_count 1) and
  // of the right shape is overwritten with the result instead of allocating.
  // `only`: the positions to step (one fragment of Streaming DiLoCo); the others come back as the same tensors and
  // keep their momentum. A buffer not yet created is zero, which steps exactly like PyTorch's first step (buf = delta).
  std::vector<at::Tensor> Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                               std::vector<at::Tensor> recycle = {},
                               const std::vector<size_t>* only = nullptr) override;

  // The same result as Step() (bit for bit), written over theta and the momentum buffers (OuterStep::StepInPlace).
  void StepInPlace(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                   const std::vector<size_t>* only = nullptr) override;
  // Momentum buffers shaped like theta, faulted in (none with momentum 0), taken and overwritten by the first step.
  void Reserve(const std::vector<at::Tensor>& theta) override;

  // Momentum buffers (empty before the first step or when momentum is 0), for checkpoints. Step() writes the new
  // buffers into other tensors (the ones of two steps ago, when nobody holds them), never in place, so a copy of
  // this vector stays valid and consistent; StepInPlace() overwrites them (its caller serializes readers).
  const std::vector<at::Tensor>& momentum_buffers() const override { return buffers_; }
  // Restores buffers from a checkpoint: empty, or one per parameter (checked by Step()).
  void set_momentum_buffers(std::vector<at::Tensor> buffers) override {
    buffers_ = std::move(buffers);
    spare_buffers_.clear();
  }
  // Undoes a step (OuterStep::SaveState): the momentum handles of before it. A first step's buffers (Reserve's, now
  // holding the refused step's momentum) become the spares again, made finite and >= 0 as the first in-place step
  // needs them (their absolute values: page-distinct, as Reserve's).
  void RestoreState(OuterStepState state) override;

 private:
  // StepInPlace's guard: throws NonFiniteStep when the step would write a NaN or an Inf into theta or the momentum.
  void CheckInPlaceFinite(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                          const std::vector<char>& stepped) const;

  Kind kind_;
  double lr_;
  double momentum_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> spare_buffers_;  // the previous step's buffers (or Reserve's), for reuse
};

}  // namespace diloco
