// FlatAdamW: the inner optimizer, AdamW with the update of torch::optim::AdamW (decoupled weight decay, bias-corrected
// moments), over flat buffers: on construction every parameter's data and .grad become views into one contiguous
// buffer each, beside one buffer per moment. A step is then one fused pass over all parameters (one loop on CPU,
// split over the intra-op threads; a handful of tensor ops elsewhere) instead of ~10 tensor ops per parameter tensor,
// zeroing the gradients is one fill, and the gradient norm for clipping is one reduction whose scale is folded into
// the step. The module keeps working as before: loads, merges, broadcasts and autograd's in-place gradient
// accumulation all write through the views (Step throws if a parameter or its gradient was replaced instead).
// The buffers hold the parameters in the order given (with decay_1d false too: the exempt tensors are segments the step
// does not decay), so that a worker cluster's slices of the wire's flat order are slices of these buffers.
// Parameters must be float32 and on one device. Unlike torch's AdamW, a parameter that got no gradient in a step is
// still decayed and moved by its momentum (every parameter of a LanguageModel gets one every step).
// Sharded (FlatShard, a worker cluster's rank with workers.sharding): the parameter and gradient buffers are padded to
// the SlicePlan's n * S elements, and the optimizer keeps moments for, and steps, only its own slice of them; the
// gradient it reads is that slice of the reduced gradient (slice_gradients(): written there by the cluster's
// reduce-scatter), and the cluster all-gathers the parameters after the step.
// Owns the flat buffers and the moments. Not thread-safe: one training thread calls it.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace diloco {

struct AdamWSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Whether 1-D tensors (norm gains, biases) are decayed too (inner.weight_decay_1d). When false they are stepped with
  // no decay, as nanoGPT's and Hugging Face's parameter groups (they keep their place in the flat buffers).
  bool decay_1d = true;
  // LibTorch's fused AdamW kernel (at::_fused_adamw_, LibTorch 2.x) instead of our loop / tensor ops: kAuto takes it
  // on CUDA where it exists; kOn also on the CPU (tests hold it to our loop); kOff never.
  enum class Fused { kAuto, kOn, kOff } fused = Fused::kAuto;
};

// One rank's part of a sharded inner step: slice `rank` of SlicePlan(numel, parts, align) (proto/slice_plan.h).
// own_gradient_slice (workers.sharding gradients): the reduced gradient slice lives in a buffer of its own, and
// ReleaseGradients may free the full gradient buffer until the next ZeroGrad (it starts freed: the first ZeroGrad
// allocates it); else (optimizer) it is a view of the
// full gradient buffer.
struct FlatShard {
  int rank = 0;
  int parts = 1;
  int64_t align = 1;
  bool own_gradient_slice = false;
  // With own_gradient_slice: no full gradient buffer at all. The parameters' gradients are autograd's own, each
  // reduced into the gradient piece and dropped as backward produces it (GradientBuckets, worker/gradient_buckets.h);
  // ZeroGrad drops any left and zeroes the piece.
  bool bucketed = false;
};

class FlatAdamW {
 public:
  // Re-homes `params` (their values are kept) and their gradients into flat buffers. With `shard`, the moments and
  // the step cover only its slice (see FlatShard).
  FlatAdamW(std::vector<torch::Tensor> params, AdamWSettings settings, const std::optional<FlatShard>& shard = {});

  // Zeroes the gradients (and re-allocates the full gradient buffer after ReleaseGradients).
  void ZeroGrad();
  // The L2 norm of all gradients together (as torch::nn::utils::clip_grad_norm_ computes it, up to float rounding).
  double GradNorm() const;
  // One AdamW step with learning rate lr on the gradients times grad_scale (clipping: max_norm / (norm + 1e-6)).
  void Step(double lr, double grad_scale = 1.0);
  // The same with the scale a one-element float tensor on the parameters' device, so that clipping needs no host sync
  // (ClipScale's result; an undefined tensor = 1).
  void Step(double lr, const torch::Tensor& grad_scale);
  // min(1, max_norm / (|gradients| + 1e-6)) as a one-element tensor on the parameters' device, computed there.
  torch::Tensor ClipScale(double max_norm) const;
  bool fused() const { return fused_; }  // whether Step runs LibTorch's fused kernel (AdamWSettings::fused)

  int64_t steps() const { return step_; }
  // The moments, flat float32 in the buffers' order (the worker's local state saves them: worker/worker_state.h).
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // Replaces the moments and the step count (bias correction goes on from `steps`): a resumed worker. Throws
  // std::invalid_argument if a moment's element count differs from the buffers' (another model or layout).
  void RestoreState(int64_t steps, const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq);
  // Starts the moments over: zeros, step 0 (bias correction from the start). A round whose training turned
  // non-finite may have left NaN in them.
  void ResetMoments();
  // All parameters / gradients, flat (the first numel elements of the padded buffers when sharded).
  const torch::Tensor& flat_parameters() const { return flat_params_; }
  const torch::Tensor& flat_gradients() const { return flat_grads_; }

  // Sharded optimizers (FlatShard); unsharded: one slice of everything, no padding.
  bool sharded() const { return sharded_; }
  bool owns_gradient_slice() const { return own_gradient_slice_; }  // FlatShard::own_gradient_slice
  bool bucketed() const { return bucketed_; }                       // FlatShard::bucketed
  // Whether some tensors are stepped without decay (decay_1d false). Since 2026-12-05 they keep their model-order
  // place in the buffers (before, they were grouped after the decayed ones): saved moments record which order.
  bool has_undecayed_segments() const {
    return std::any_of(segments_.begin(), segments_.end(), [](const Segment& s) { return !s.decayed; });
  }
  // The padded buffers (n * S elements; the padding stays zero) and this rank's piece of S elements of each: the
  // reduce-scatter's input and output, the all-gather's input (the parameter piece) and output. Bucketed: no
  // gradient buffer (padded_gradients() and flat_gradients() are undefined tensors).
  const torch::Tensor& padded_parameters() const { return params_; }
  const torch::Tensor& padded_gradients() const { return grads_; }
  torch::Tensor parameter_piece() const;
  const torch::Tensor& gradient_piece() const { return gradient_piece_; }
  // The squared L2 norm of the gradient this step reads (the slice's when sharded), a one-element float tensor on the
  // parameters' device: the cluster sums the ranks' for global clipping.
  torch::Tensor SquaredSliceNorm() const;
  // own_gradient_slice: frees the full gradient buffer (its gradient views dangle until ZeroGrad re-allocates it;
  // nothing may read them meanwhile). No-op otherwise.
  void ReleaseGradients();

 private:
  // A run of the buffers' elements that is decayed (or not) as a whole: [begin, end).
  struct Segment {
    int64_t begin, end;
    bool decayed;
  };
  std::vector<Segment> WindowSegments() const;  // the segments clipped to the window, indexed from its start
  void CheckViews() const;
  void UpdateWithTensorOps(double lr, const torch::Tensor& grads);  // devices other than the CPU, without fusion
  // The flat buffers and the window; then, once the parameters live in them, the moments and the gradient slice.
  void SetUpShard(int64_t total, const torch::TensorOptions& options, const std::optional<FlatShard>& shard);
  void AllocateSliceState(const torch::TensorOptions& options);

  std::vector<torch::Tensor> views_;  // the parameters, now views into params_
  AdamWSettings settings_;
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_;
  torch::Tensor flat_params_, flat_grads_;  // params_, grads_ without the padding
  // The stepped window [begin_, end_) of the buffers (everything unless sharded), the gradient the step reads for it
  // (a view of grads_ or, own_gradient_slice, of its own buffer) and the S-element piece the reduce-scatter fills.
  bool sharded_ = false;
  bool own_gradient_slice_ = false;
  bool bucketed_ = false;
  bool released_ = false;  // ReleaseGradients freed grads_' memory
  int64_t begin_ = 0, end_ = 0, piece_begin_ = 0, piece_length_ = 0;
  torch::Tensor step_grads_, gradient_piece_;
  bool fused_ = false;
  std::vector<Segment> segments_;  // of the whole buffers, in order, covering [0, numel)
  int64_t step_ = 0;
};

}  // namespace diloco
