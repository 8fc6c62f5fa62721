#include "worker/flat_adamw.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <stdexcept>
#include <tuple>

#include "proto/slice_plan.h"
#include "worker/free_memory.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

struct StepConstants {
  float decay, beta1, beta2, one_minus_beta1, one_minus_beta2, sqrt_bias_correction2, eps, step_size, grad_scale;
};

// One AdamW step over [begin, end): the float math of torch::optim::AdamW's per-tensor ops, element by element.
// Compiled with -fno-math-errno so that sqrt vectorizes.
void AdamWKernel(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                 const StepConstants& c, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const float grad = g[j] * c.grad_scale;
    const float mj = m[j] * c.beta1 + grad * c.one_minus_beta1;
    const float vj = v[j] * c.beta2 + c.one_minus_beta2 * grad * grad;
    m[j] = mj;
    v[j] = vj;
    p[j] = p[j] * c.decay - c.step_size * (mj / (std::sqrt(vj) / c.sqrt_bias_correction2 + c.eps));
  }
}

}  // namespace

FlatAdamW::FlatAdamW(std::vector<torch::Tensor> params, AdamWSettings settings, const std::optional<FlatShard>& shard)
    : views_(std::move(params)), settings_(settings) {
  if (views_.empty()) throw std::invalid_argument("FlatAdamW: no parameters");
  int64_t total = 0;
  for (const torch::Tensor& p : views_) {
    if (p.scalar_type() != torch::kFloat || p.device() != views_[0].device()) {
      throw std::invalid_argument("FlatAdamW: parameters must be float32 on one device");
    }
    total += p.numel();
  }
  const auto options = views_[0].options().requires_grad(false);
  torch::NoGradGuard no_grad;
  SetUpShard(total, options, shard);
  fused_ =
      torch_compat::kHasFusedAdamW && (settings_.fused == AdamWSettings::Fused::kOn ||
                                       (settings_.fused == AdamWSettings::Fused::kAuto && params_.device().is_cuda()));
  if (settings_.fused == AdamWSettings::Fused::kOn && !torch_compat::kHasFusedAdamW) {
    throw std::invalid_argument("FlatAdamW: the fused AdamW kernel needs LibTorch 2.x");
  }
  // The tensors in the order given (the wire's flat order, so that a cluster's slices of theta are slices of these
  // buffers); runs of tensors exempt from decay (1-D ones unless decay_1d) become the step's undecayed segments.
  // Each tensor's own storage is freed as soon as it is copied, and on the CPU given back to the kernel every
  // kReturnBytes (the allocator keeps freed memory resident otherwise): the set-up never holds the model twice, and
  // the moments allocated next are not stacked on top of a freed copy of it.
  constexpr int64_t kReturnBytes = int64_t{64} << 20;
  const bool on_cpu = params_.device().is_cpu();
  int64_t freed_bytes = 0;
  int64_t offset = 0;
  for (torch::Tensor& p : views_) {
    const int64_t n = p.numel();
    const bool decayed = settings_.decay_1d || p.dim() >= 2;
    if (n > 0) {
      if (!segments_.empty() && segments_.back().decayed == decayed && segments_.back().end == offset) {
        segments_.back().end += n;
      } else {
        segments_.push_back({offset, offset + n, decayed});
      }
    }
    torch::Tensor slot = params_.narrow(0, offset, n).view(p.sizes());
    slot.copy_(p.detach());
    p.set_data(slot);
    freed_bytes += n * 4;
    if (on_cpu && freed_bytes >= kReturnBytes) {
      ReturnFreeMemory();
      freed_bytes = 0;
    }
    if (bucketed_) {
      p.mutable_grad().reset();
    } else {
      p.mutable_grad() = grads_.narrow(0, offset, n).view(p.sizes());
    }
    offset += n;
  }
  if (on_cpu) ReturnFreeMemory();
  if (own_gradient_slice_) ReleaseGradients();  // allocated by the first ZeroGrad, freed after each reduce-scatter
  // Now that the parameters' own storage is freed: the moments and the gradient slice can take its place.
  AllocateSliceState(options);
}

std::vector<FlatAdamW::Segment> FlatAdamW::WindowSegments() const {
  std::vector<Segment> out;  // indexed from the window's start
  for (const Segment& s : segments_) {
    const int64_t lo = std::max(s.begin, begin_), hi = std::min(s.end, end_);
    if (hi > lo) out.push_back({lo - begin_, hi - begin_, s.decayed});
  }
  return out;
}

void FlatAdamW::SetUpShard(int64_t total, const torch::TensorOptions& options, const std::optional<FlatShard>& shard) {
  int64_t padded = total;
  begin_ = 0;
  end_ = total;
  if (shard) {
    const SlicePlan plan(total, shard->parts, shard->align);
    const FlatRange range = plan.slice(shard->rank);
    sharded_ = true;
    own_gradient_slice_ = shard->own_gradient_slice;
    bucketed_ = shard->own_gradient_slice && shard->bucketed;
    padded = plan.padded_numel();
    begin_ = range.begin;
    end_ = range.end;
    piece_begin_ = shard->rank * plan.slice_length();
    piece_length_ = plan.slice_length();
  }
  // Untouched (not resident) until the constructor copies each parameter into its place; only the padding is zeroed.
  params_ = torch::empty({padded}, options);
  params_.narrow(0, total, padded - total).zero_();
  // Own gradient slice: untouched memory (not resident) until the first ZeroGrad, as the constructor releases it.
  if (!bucketed_) {
    grads_ = own_gradient_slice_ ? torch::empty({padded}, options) : torch::zeros({padded}, options);
    flat_grads_ = grads_.narrow(0, 0, total);
  }
  flat_params_ = params_.narrow(0, 0, total);
}

void FlatAdamW::AllocateSliceState(const torch::TensorOptions& options) {
  exp_avg_ = torch::zeros({end_ - begin_}, options);
  exp_avg_sq_ = torch::zeros({end_ - begin_}, options);
  if (!sharded_) {
    step_grads_ = grads_;
  } else if (own_gradient_slice_) {
    gradient_piece_ = torch::zeros({piece_length_}, options);
    step_grads_ = gradient_piece_.narrow(0, 0, end_ - begin_);
  } else {
    gradient_piece_ = grads_.narrow(0, piece_begin_, piece_length_);
    step_grads_ = grads_.narrow(0, begin_, end_ - begin_);
  }
}

torch::Tensor FlatAdamW::parameter_piece() const {
  return sharded_ ? params_.narrow(0, piece_begin_, piece_length_) : params_;
}

torch::Tensor FlatAdamW::SquaredSliceNorm() const {
  torch::NoGradGuard no_grad;
  return step_grads_.norm().square().reshape({1});
}

void FlatAdamW::ReleaseGradients() {
  if (!own_gradient_slice_ || bucketed_ || released_) return;
  c10::StorageImpl* storage = grads_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, grads_.device()));
  storage->set_nbytes(0);
  released_ = true;
}

void FlatAdamW::ZeroGrad() {
  if (bucketed_) {
    for (torch::Tensor& p : views_) p.mutable_grad().reset();
    gradient_piece_.zero_();
    return;
  }
  if (released_) {  // the same storage gets new memory: the gradient views see it again
    // On the gradients' device: a CUDA allocator allocates on the current device, which for a rank on cuda:1 is
    // not cuda:1 unless set.
    const c10::OptionalDeviceGuard on_device(grads_.device());
    c10::StorageImpl* storage = grads_.storage().unsafeGetStorageImpl();
    const size_t bytes = static_cast<size_t>(grads_.numel()) * sizeof(float);
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    storage->set_nbytes(bytes);
    released_ = false;
  }
  grads_.zero_();
}

double FlatAdamW::GradNorm() const { return grads_.norm().item<double>(); }

torch::Tensor FlatAdamW::ClipScale(double max_norm) const {
  torch::NoGradGuard no_grad;
  return (max_norm / (grads_.norm() + 1e-6)).clamp_max(1.0).reshape({1});
}

void FlatAdamW::Step(double lr, const torch::Tensor& grad_scale) {
  if (params_.device().is_cpu() && !fused_) {  // the CPU loop takes a host scalar: one read of one float
    Step(lr, grad_scale.defined() ? grad_scale.item<double>() : 1.0);
    return;
  }
  torch::NoGradGuard no_grad;
  CheckViews();
  ++step_;
  if (fused_) {
    // The kernel divides the gradients by its scale: pass 1 / grad_scale (on the device).
    const torch::Tensor inverse = grad_scale.defined() ? grad_scale.reciprocal() : torch::ones({1}, params_.options());
    const torch::Tensor params = params_.narrow(0, begin_, end_ - begin_);
    for (const bool decayed : {true, false}) {
      std::vector<torch::Tensor> p, g, m, v, steps;
      for (const Segment& s : WindowSegments()) {
        if (s.decayed != decayed) continue;
        const int64_t n = s.end - s.begin;
        p.push_back(params.narrow(0, s.begin, n));
        g.push_back(step_grads_.narrow(0, s.begin, n));
        m.push_back(exp_avg_.narrow(0, s.begin, n));
        v.push_back(exp_avg_sq_.narrow(0, s.begin, n));
        // The kernel takes each tensor's step count, this step included (a float on the device), as torch.optim does.
        steps.push_back(torch::full({1}, static_cast<double>(step_), params_.options()));
      }
      if (p.empty()) continue;
      torch_compat::FusedAdamW(p, g, m, v, steps, lr, settings_.beta1, settings_.beta2,
                               decayed ? settings_.weight_decay : 0.0, settings_.eps, inverse);
    }
    return;
  }
  UpdateWithTensorOps(lr, grad_scale.defined() ? step_grads_ * grad_scale : step_grads_);
}

void FlatAdamW::CheckViews() const {
  // Something that replaced a parameter's data or gradient (module zero_grad setting grads to none, .to(), a
  // set_data) would cut it off the flat buffers and train on nothing: refuse loudly instead.
  const torch::Tensor& first = views_[0];
  // Released gradients (own_gradient_slice) have no memory until ZeroGrad; the step reads the own slice then.
  if (first.data_ptr() != params_.data_ptr() ||
      (!bucketed_ && (!first.grad().defined() || (!released_ && first.grad().data_ptr() != grads_.data_ptr())))) {
    throw std::logic_error("FlatAdamW: the parameters or gradients are no longer views of the flat buffers");
  }
}

void FlatAdamW::UpdateWithTensorOps(double lr, const torch::Tensor& grads) {
  const double bias_correction1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(settings_.beta2, static_cast<double>(step_));
  torch::Tensor params = sharded_ ? params_.narrow(0, begin_, end_ - begin_) : params_;
  for (const Segment& s : WindowSegments()) {
    if (s.decayed) params.narrow(0, s.begin, s.end - s.begin).mul_(1.0 - lr * settings_.weight_decay);
  }
  exp_avg_.mul_(settings_.beta1).add_(grads, 1.0 - settings_.beta1);
  exp_avg_sq_.mul_(settings_.beta2).addcmul_(grads, grads, 1.0 - settings_.beta2);
  params.addcdiv_(exp_avg_, (exp_avg_sq_.sqrt() / std::sqrt(bias_correction2)).add_(settings_.eps),
                  -lr / bias_correction1);
}

void FlatAdamW::Step(double lr, double grad_scale) {
  if (fused_ || !params_.device().is_cpu()) {
    Step(lr, grad_scale == 1.0 ? torch::Tensor() : torch::full({1}, grad_scale, params_.options()));
    return;
  }
  torch::NoGradGuard no_grad;
  CheckViews();
  ++step_;
  const double bias_correction1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(settings_.beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double decay = 1.0 - lr * settings_.weight_decay;
  {
    const StepConstants c{static_cast<float>(decay),
                          static_cast<float>(settings_.beta1),
                          static_cast<float>(settings_.beta2),
                          static_cast<float>(1.0 - settings_.beta1),
                          static_cast<float>(1.0 - settings_.beta2),
                          static_cast<float>(std::sqrt(bias_correction2)),
                          static_cast<float>(settings_.eps),
                          static_cast<float>(step_size),
                          static_cast<float>(grad_scale)};
    // The window's elements, indexed from its start (everything when unsharded).
    float* p = params_.data_ptr<float>() + begin_;
    const float* g = step_grads_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    StepConstants exempt = c;
    exempt.decay = 1.0f;
    for (const Segment& s : WindowSegments()) {
      const StepConstants& k = s.decayed ? c : exempt;
      at::parallel_for(s.begin, s.end, int64_t{1} << 15,
                       [&](int64_t begin, int64_t end) { AdamWKernel(p, g, m, v, k, begin, end); });
    }
  }
}

void FlatAdamW::RestoreState(int64_t steps, const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq) {
  if (steps < 0 || exp_avg.numel() != exp_avg_.numel() || exp_avg_sq.numel() != exp_avg_sq_.numel()) {
    throw std::invalid_argument("FlatAdamW: saved state of " + std::to_string(exp_avg.numel()) + " elements at step " +
                                std::to_string(steps) + " does not fit " + std::to_string(exp_avg_.numel()) +
                                " parameters");
  }
  torch::NoGradGuard no_grad;
  exp_avg_.copy_(exp_avg.reshape({-1}));
  exp_avg_sq_.copy_(exp_avg_sq.reshape({-1}));
  step_ = steps;
}

void FlatAdamW::ResetMoments() {
  torch::NoGradGuard no_grad;
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  step_ = 0;
}

}  // namespace diloco
