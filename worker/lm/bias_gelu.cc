#include "worker/lm/bias_gelu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <stdexcept>

#include "worker/lm/bias_gelu_kernels.h"

namespace diloco {
namespace {

// Rows per parallel task: a few hundred KB of the [rows][cols] matrix.
constexpr int64_t kGrainElements = 1 << 16;

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& pre,
                               const torch::Tensor& bias) {
    RECORD_FUNCTION("diloco::BiasGelu", std::vector<c10::IValue>());  // named in profiles
    const torch::Tensor in = pre.contiguous(), b = bias.contiguous();
    const int64_t cols = b.numel(), rows = in.numel() / cols;
    torch::Tensor biased = torch::empty_like(in), out = torch::empty_like(in);
    const float* p = in.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* bi = biased.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / cols), [&](int64_t begin, int64_t end) {
      gelu::Forward(p, bp, cols, begin, end, bi, o);
    });
    ctx->saved_data["biased"] = biased;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor biased = ctx->saved_data["biased"].toTensor();
    const torch::Tensor grad_out = grads[0].contiguous();
    const int64_t cols = biased.size(-1), rows = biased.numel() / cols;
    torch::Tensor grad_in = torch::empty_like(biased);
    const float* bi = biased.data_ptr<float>();
    const float* g = grad_out.data_ptr<float>();
    float* gi = grad_in.data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / cols), [&](int64_t begin, int64_t end) {
      gelu::Backward(bi, g, cols, begin, end, gi);
    });
    return {grad_in, grad_in.reshape({rows, cols}).sum(0)};
  }
};

}  // namespace

torch::Tensor BiasGeluReference(const torch::Tensor& pre, const torch::Tensor& bias) {
  return torch::gelu(pre + bias);
}

torch::Tensor BiasGelu(const torch::Tensor& pre, const torch::Tensor& bias) {
  if (bias.dim() != 1 || pre.dim() < 1 || pre.size(-1) != bias.size(0)) {
    throw std::invalid_argument("BiasGelu: bias must be [N] and pre [..., N]");
  }
  if (!pre.device().is_cpu() || pre.scalar_type() != torch::kFloat || bias.scalar_type() != torch::kFloat ||
      !bias.device().is_cpu() || pre.numel() == 0) {
    return BiasGeluReference(pre, bias);
  }
  return BiasGeluFunction::apply(pre, bias);
}

}  // namespace diloco
