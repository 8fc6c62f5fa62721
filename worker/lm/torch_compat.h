// torch_compat: the few calls whose C++ API differs between the two LibTorch builds we support (cmake/torch.cmake):
// Debian's 1.13 (CPU) and the 2.x of PyPI's torch wheel (CUDA). Every version test of the tree is here; the rest of the
// code calls these helpers and never tests TORCH_VERSION itself. Stateless; thread-safe as the calls they wrap
// (autocast state is thread-local in LibTorch).
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <optional>
#include <stdexcept>

// 2.4 and later: the device-taking autocast API.
#define DILOCO_TORCH_2_4 (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace diloco::torch_compat {

// Whether this LibTorch has at::scaled_dot_product_attention (2.0 and later: fused flash / memory-efficient kernels on
// CUDA) and at::_fused_adamw_ (2.0 and later; CPU kernels since 2.4).
inline constexpr bool kHasSdpa = TORCH_VERSION_MAJOR >= 2;
inline constexpr bool kHasFusedAdamW = TORCH_VERSION_MAJOR >= 2;

// Autocast of one device type (CPU or CUDA). 2.4 replaced the per-device functions (set_cpu_enabled,
// set_autocast_gpu_dtype, ...) by ones that take the device type; the old ones warn on every call since.
inline bool AutocastEnabled(at::DeviceType device) {
#if DILOCO_TORCH_2_4
  return at::autocast::is_autocast_enabled(device);
#else
  return device == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline at::ScalarType AutocastDtype(at::DeviceType device) {
#if DILOCO_TORCH_2_4
  return at::autocast::get_autocast_dtype(device);
#else
  return device == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void SetAutocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
#if DILOCO_TORCH_2_4
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

// Whether this LibTorch was built with CUDA (whatever the machine has): the 2.x wheel's CUDA hooks say so; Debian's
// 1.13 has none.
inline bool CudaBuilt() {
#if TORCH_VERSION_MAJOR >= 2
  return at::detail::getCUDAHooks().isBuilt();
#else
  return false;
#endif
}

// Causal attention of q, k, v [B, H, T, D] by LibTorch's fused kernel (at::scaled_dot_product_attention). Only to be
// called where kHasSdpa; the 1.13 build never reaches it (it throws there).
inline torch::Tensor CausalSdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  (void)q, (void)k, (void)v;
  throw std::logic_error("scaled_dot_product_attention needs LibTorch 2.x");
#endif
}

// One AdamW step of LibTorch's fused kernel over `params` (each with its gradient and moments), decoupled weight decay
// as torch.optim.AdamW, gradients divided by *inv_grad_scale (a one-element float tensor on the parameters' device,
// so clipping needs no host sync) and `step` (a one-element float tensor, already incremented) for bias correction.
inline void FusedAdamW(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                       at::TensorList steps, double lr, double beta1, double beta2, double weight_decay, double eps,
                       const torch::Tensor& inv_grad_scale) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, inv_grad_scale, /*found_inf=*/std::nullopt);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2;
  (void)weight_decay, (void)eps, (void)inv_grad_scale;
  throw std::logic_error("the fused AdamW kernel needs LibTorch 2.x");
#endif
}

}  // namespace diloco::torch_compat
