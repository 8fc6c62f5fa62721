// The float loops behind BiasGelu (worker/lm/bias_gelu.h), over rows [begin, end) of a row-major [rows][cols]
// matrix, on raw pointers (no LibTorch here). Built for AVX2+FMA and for the baseline x86-64 (kernel_dispatch.h
// picks one).
// Pure functions of their arguments: thread-safe on disjoint row ranges.
#pragma once

#include <cstdint>

namespace diloco::gelu {

// biased[r][c] = pre[r][c] + bias[c]; out[r][c] = gelu(biased[r][c]).
void Forward(const float* pre, const float* bias, int64_t cols, int64_t begin, int64_t end, float* biased,
             float* out);

// grad_in[r][c] = grad_out[r][c] x gelu'(biased[r][c]).
void Backward(const float* biased, const float* grad_out, int64_t cols, int64_t begin, int64_t end, float* grad_in);

}  // namespace diloco::gelu
