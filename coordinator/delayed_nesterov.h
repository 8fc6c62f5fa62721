// DelayedNesterov: the outer optimizer of asynchronous DiLoCo (outer.mode async), Delayed Nesterov (DN) from
// "Asynchronous Local-SGD Training for Language Modeling" (Liu et al., arXiv 2401.09135, Algorithm 3, with c = 0).
// Each arriving pseudo-gradient g is applied at once; the momentum moves only every N arrivals, with the mean of the
// N pseudo-gradients buffered since its last move:
//   acc <- acc + g;  t <- t + 1
//   if t mod N == 0:  m <- beta m + acc / N;  theta <- theta - lr beta m - (lr / N) g;  acc <- 0
//   else:             theta <- theta - (lr / N) g
// With N = 1 this is PyTorch's SGD(nesterov=True) step (buf = beta buf + g; theta -= lr (g + beta buf)): naive
// asynchronous Nesterov, the paper's unstable baseline. Shapes: lists of float32 tensors of matching shapes.
// Owns m and acc. Implements OuterStep (outer_step.h). Not thread-safe: the coordinator's round thread alone calls
// Step().
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "coordinator/outer_step.h"

namespace diloco {

class DelayedNesterov : public OuterStep {
 public:
  DelayedNesterov(double lr, double momentum, int64_t delay_n);

  // theta after one arrival of g, in new tensors (theta itself is left untouched: pulls may still read it).
  std::vector<at::Tensor> Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& g);
  // OuterStep: the same, for the whole model (`only` must be nullptr: asynchronous rounds have one fragment);
  // `recycle` is not used.
  std::vector<at::Tensor> Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& g,
                               std::vector<at::Tensor> recycle, const std::vector<size_t>* only) override;

  int64_t arrivals() const { return arrivals_; }
  // m, for checkpoints (empty before the first momentum move). Never modified in place once returned.
  const std::vector<at::Tensor>& momentum_buffers() const override { return m_; }
  // Restores m from a checkpoint; the arrival count and the buffer acc start over (a partial buffer is not saved).
  void set_momentum_buffers(std::vector<at::Tensor> m) override { m_ = std::move(m); }
  // m, acc and the arrival count (Step replaces m and acc with new tensors, so the handles undo it exactly).
  OuterStepState SaveState() const override { return {{m_, acc_}, arrivals_}; }
  void RestoreState(OuterStepState state) override {
    m_ = std::move(state.buffers.at(0));
    acc_ = std::move(state.buffers.at(1));
    arrivals_ = state.arrivals;
  }

 private:
  double lr_;
  double momentum_;
  int64_t delay_n_;
  int64_t arrivals_ = 0;
  std::vector<at::Tensor> m_;
  std::vector<at::Tensor> acc_;
};

}  // namespace diloco
