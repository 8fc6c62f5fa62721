#include "worker/lm/rms_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "worker/lm/kernel_dispatch.h"

namespace diloco {
namespace {

constexpr int64_t kRowBlock = 64;  // rows per partial sum of the weight's gradient

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const torch::Tensor input = x.contiguous(), w = weight.contiguous();
    const int64_t D = input.size(-1), N = input.numel() / D;
    torch::Tensor out = torch::empty_like(input);
    torch::Tensor inv_rms = torch::empty({N}, input.options());
    const float* in = input.data_ptr<float>();
    const float* g = w.data_ptr<float>();
    float* o = out.data_ptr<float>();
    float* r = inv_rms.data_ptr<float>();
    at::parallel_for(0, N, kRowBlock, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const float* row = in + n * D;
        float sum = 0.0f;
        for (int64_t d = 0; d < D; ++d) sum += row[d] * row[d];
        const float inv = 1.0f / std::sqrt(sum / static_cast<float>(D) + static_cast<float>(eps));
        r[n] = inv;
        for (int64_t d = 0; d < D; ++d) o[n * D + d] = g[d] * (row[d] * inv);
      }
    });
    ctx->save_for_backward({input, w, inv_rms});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(), "RmsNorm: no double backward (create_graph)");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& inv_rms = saved[2];
    const torch::Tensor grad = grads[0].contiguous();
    const int64_t D = input.size(-1), N = input.numel() / D, blocks = (N + kRowBlock - 1) / kRowBlock;
    torch::Tensor d_input = torch::empty_like(input);
    torch::Tensor partial = torch::zeros({blocks, D}, input.options());
    const float* x = input.data_ptr<float>();
    const float* g = w.data_ptr<float>();
    const float* r = inv_rms.data_ptr<float>();
    const float* up = grad.data_ptr<float>();
    float* dx = d_input.data_ptr<float>();
    float* dw = partial.data_ptr<float>();
    // dx = r (u - x r^2 mean(u x)) with u = upstream * weight; dweight = sum over rows of upstream * x * r.
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t n = b * kRowBlock; n < std::min(N, (b + 1) * kRowBlock); ++n) {
          const float* xr = x + n * D;
          const float* ur = up + n * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += ur[d] * g[d] * xr[d];
          const float rn = r[n], k = rn * rn * rn * dot / static_cast<float>(D);
          for (int64_t d = 0; d < D; ++d) {
            dx[n * D + d] = rn * (ur[d] * g[d]) - k * xr[d];
            dw[b * D + d] += ur[d] * (xr[d] * rn);
          }
        }
      }
    });
    return {d_input, partial.sum(0), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RmsNormReference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto h = x.to(torch::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

torch::Tensor RmsNormForward(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const bool fused = UseFusedKernels() && x.device().is_cpu() && x.scalar_type() == torch::kFloat &&
                     weight.device().is_cpu() && weight.scalar_type() == torch::kFloat && x.numel() > 0;
  return fused ? RmsNormFunction::apply(x, weight, eps) : RmsNormReference(x, weight, eps);
}

}  // namespace diloco
