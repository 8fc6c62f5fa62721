// FlatAdamW: the inner optimizer, AdamW with the update of torch::optim::AdamW (decoupled weight decay, bias-corrected
// moments), over flat buffers: on construction every parameter's data and .grad become views into one contiguous
// buffer each, beside one buffer per moment. A step is then one fused pass over all parameters (one loop on CPU,
// split over the intra-op threads; a handful of tensor ops elsewhere) instead of ~10 tensor ops per parameter tensor,
// zeroing the gradients is one fill, and the gradient norm for clipping is one reduction whose scale is folded into
// the step. The module keeps working as before: loads, merges, broadcasts and autograd's in-place gradient
// accumulation all write through the views (Step throws if a parameter or its gradient was replaced instead).
// The buffers hold the parameters in the order given, except with decay_1d false (see AdamWSettings).
// Parameters must be float32 and on one device. Unlike torch's AdamW, a parameter that got no gradient in a step is
// still decayed and moved by its momentum (every parameter of a LanguageModel gets one every step).
// Owns the flat buffers and the moments. Not thread-safe: one training thread calls it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace diloco {

struct AdamWSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Whether 1-D tensors (norm gains, biases) are decayed too (inner.weight_decay_1d). When false they are laid after
  // the decayed ones in the flat buffers and stepped with no decay, as nanoGPT's and Hugging Face's parameter groups.
  bool decay_1d = true;
  // LibTorch's fused AdamW kernel (at::_fused_adamw_, LibTorch 2.x) instead of our loop / tensor ops: kAuto takes it
  // on CUDA where it exists; kOn also on the CPU (tests hold it to our loop); kOff never.
  enum class Fused { kAuto, kOn, kOff } fused = Fused::kAuto;
};

class FlatAdamW {
 public:
  // Re-homes `params` (their values are kept) and their gradients into flat buffers.
  FlatAdamW(std::vector<torch::Tensor> params, AdamWSettings settings);

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
  const torch::Tensor& flat_parameters() const { return params_; }
  const torch::Tensor& flat_gradients() const { return grads_; }

 private:
  void CheckViews() const;
  void UpdateWithTensorOps(double lr, const torch::Tensor& grads);  // devices other than the CPU, without fusion

  std::vector<torch::Tensor> views_;  // the parameters, now views into params_
  AdamWSettings settings_;
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_;
  size_t first_laid_ = 0;  // the view at offset 0
  bool fused_ = false;
  int64_t decayed_ = 0;  // params_[0, decayed_) get weight decay, the rest none
  int64_t step_ = 0;
};

}  // namespace diloco
