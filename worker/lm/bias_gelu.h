// BiasGelu: gelu(pre + bias), the exact (erf) GELU of a linear layer's output plus its bias, as one autograd op.
// pre [..., N], bias [N] -> [..., N]; differentiable with respect to both.
//
// Why: the MLP's GELU and its gradient ran at about 2.5 ns per element in ATen's kernels (the erf and exp of every
// element, plus separate passes for the bias and its gradient's row sum); on CPU float32 this op adds the bias and
// applies GELU in one pass, keeps the biased input for the backward pass, and computes the gradient in one more.
// Its erf is the Abramowitz-Stegun 7.1.26 form (absolute error <= 1.5e-7, as in ATen's vectorized erf), with
// 1 + erf(z) computed directly for z < 0 so the negative tail does not cancel to 0. Other devices and dtypes take
// torch::gelu(pre + bias).
// Stateless and thread-safe; parallel over rows with ATen's intra-op threads.
#pragma once

#include <torch/torch.h>

namespace diloco {

torch::Tensor BiasGelu(const torch::Tensor& pre, const torch::Tensor& bias);

// The same as composite LibTorch ops: the fallback, and what the tests hold BiasGelu to.
torch::Tensor BiasGeluReference(const torch::Tensor& pre, const torch::Tensor& bias);

}  // namespace diloco
