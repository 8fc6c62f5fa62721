// RMSNorm of the llama-shaped families as one autograd op: weight * x / sqrt(mean(x^2 over the last dimension) + eps),
// Hugging Face's LlamaRMSNorm (normalised in float32). On CPU float32 (with the fused kernels allowed,
// worker/lm/kernel_dispatch.h) the forward pass is one loop over the rows that keeps 1 / rms per row, and the backward
// pass one loop for the input's gradient and per-64-row partial sums for the weight's (summed in a fixed order, so the
// result does not depend on the thread count); elsewhere, and as the reference the tests hold it to, the composite
// ops. Replaces the ~6 forward and ~10 backward elementwise ops of the composite form. Stateless and thread-safe.
#pragma once

#include <torch/torch.h>

namespace diloco {

// x [..., D], weight [D]. Differentiable with respect to x and weight (no double backward on the fused path).
torch::Tensor RmsNormForward(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The same as composite LibTorch ops (transformers' order: float32, pow, mean, rsqrt, multiply, cast, weight).
torch::Tensor RmsNormReference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace diloco
