// RoundAccumulator: the token-weighted sum of the pseudo-gradients pushed in one round, folded chunk by chunk as
// they arrive, so memory is one float32 copy of the parameters whatever the number of workers (docs/development.md,
// "Architecture").
//   sum_t = sum_i w_i * delta_i        (w_i = tokens worker i processed; Fold adds w_i * chunk)
//   delta = sum_t / sum_i w_i          (Average)
// With per-coordinate weights (SparseLoCo's rule, comm.topk_average senders) it also keeps, per element, the sum of
// the weights of the pushes that sent it, W_j = sum_{i sent j} w_i (a dense chunk sends every element), and
//   delta_j = sum_j / W_j, or 0 where no push sent j    (one more float32 copy of the parameters)
// Shapes: one float32 tensor per model parameter, in parameter order. Not thread-safe: the coordinator calls it
// under its own mutex.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "proto/all_finite.h"  // AllFinite: every chunk is checked before it is folded
#include "proto/tensor_spec.h"

namespace diloco {

class RoundAccumulator {
 public:
  // per_coordinate: keep W_j and divide by it (SparseLoCo's rule) instead of by the total weight.
  explicit RoundAccumulator(const std::vector<TensorSpec>& specs, bool per_coordinate = false);

  // Adds weight * values to elements [offset, offset + values.numel()) of tensor `index`. values: 1-D, any float dtype.
  // count_weight: what the push adds to W_j there (its tokens without a clip scale); < 0: weight.
  void Fold(size_t index, int64_t offset, const at::Tensor& values, double weight, double count_weight = -1);
  // Adds weight * values[i] to element offset + positions[i] of tensor `index` (a sparse chunk: positions int64,
  // values float32, both 1-D of one length; positions checked by the caller), touching only those elements.
  // count_weight: what the push adds to W_j at those positions (its tokens without a clip scale); < 0: weight.
  void FoldSparse(size_t index, int64_t offset, const at::Tensor& positions, const at::Tensor& values, double weight,
                  double count_weight = -1);

  // Counts one complete contribution of the given weight.
  void AddContribution(double weight);

  int64_t contributions() const { return contributions_; }
  double total_weight() const { return total_weight_; }

  // sum / total_weight as new tensors shaped like the parameters. Requires total_weight() > 0.
  std::vector<at::Tensor> Average() const;

  // Closes the round without allocating: divides the sums by total_weight() in place and hands them out (the round's
  // delta), with zero counts. Until Restore gives them back the accumulator holds no sums: the coordinator folds no
  // chunk while it steps (Fold would throw std::out_of_range; Reset does nothing). So the sums are the one copy
  // of the parameters this class needs. Requires total_weight() > 0.
  std::vector<at::Tensor> TakeAverage();
  // Gives back the tensors TakeAverage handed out, zeroed by the caller (outside the coordinator's lock: zeroing
  // 4 bytes x params takes a while); the next round folds into them.
  void Restore(std::vector<at::Tensor> zeroed);

  // Zeroes the sums and counts (start of a round, or a round whose aggregation had to restart).
  void Reset();

 private:
  std::vector<at::Tensor> sums_;     // empty between TakeAverage and Restore
  std::vector<at::Tensor> weights_;  // W_j per element (per_coordinate only; zero between rounds)
  size_t count_;                     // tensors in the model
  double total_weight_ = 0;
  int64_t contributions_ = 0;
};

}  // namespace diloco
