#include "worker/lm/bias_gelu_kernels.h"

#include <algorithm>

#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/simd.h"

namespace diloco::gelu {
namespace {

using simd::Load;
using simd::Splat;
using simd::Store;
using simd::V8;

// For x: half_cdf = (1 + erf(x / sqrt 2)) / 2 and density = exp(-x^2 / 2) / sqrt(2 pi).
// erf by Abramowitz-Stegun 7.1.26 (absolute error <= 1.5e-7): for z >= 0, erf(z) = 1 - y with
// y = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2), t = 1 / (1 + p z); erf is odd, so 1 + erf(z) = 2 - y
// for z >= 0 and y for z < 0 (no cancellation in the negative tail).
DILOCO_SIMD_INLINE void GeluParts(V8 x, V8* half_cdf, V8* density) {
  const V8 z = x * Splat(0.70710678118654752f);
  const V8 abs_z = z < Splat(0.0f) ? -z : z;
  const V8 t = Splat(1.0f) / (Splat(1.0f) + Splat(0.3275911f) * abs_z);
  V8 poly = Splat(1.061405429f);
  poly = poly * t + Splat(-1.453152027f);
  poly = poly * t + Splat(1.421413741f);
  poly = poly * t + Splat(-0.284496736f);
  poly = poly * t + Splat(0.254829592f);
  const V8 e = simd::ExpNonPositive(-(z * z));  // exp(-x^2 / 2)
  const V8 y = poly * t * e;
  *half_cdf = Splat(0.5f) * (z < Splat(0.0f) ? y : Splat(2.0f) - y);
  *density = Splat(0.39894228040143268f) * e;
}

DILOCO_SIMD_INLINE V8 ForwardBlock(V8 pre, V8 bias, V8* biased) {
  *biased = pre + bias;
  V8 half_cdf, density;
  GeluParts(*biased, &half_cdf, &density);
  return *biased * half_cdf;
}

DILOCO_SIMD_INLINE V8 BackwardBlock(V8 biased, V8 grad) {
  V8 half_cdf, density;
  GeluParts(biased, &half_cdf, &density);
  return grad * (half_cdf + biased * density);
}

// A row's last cols % 8 elements go through the same vector code via a zero-padded copy.
DILOCO_SIMD_INLINE V8 Tail(const float* p, int64_t n) {
  float tmp[8] = {};
  std::copy(p, p + n, tmp);
  return Load(tmp);
}
DILOCO_SIMD_INLINE void StoreTail(float* p, V8 v, int64_t n) {
  float tmp[8];
  Store(tmp, v);
  std::copy(tmp, tmp + n, p);
}

DILOCO_SIMD_INLINE void ForwardBody(const float* pre, const float* bias, int64_t cols, int64_t begin, int64_t end,
                                    float* biased, float* out) {
  const int64_t full = cols / 8 * 8, rest = cols - full;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t o = r * cols;
    V8 b;
    for (int64_t c = 0; c < full; c += 8) {
      Store(out + o + c, ForwardBlock(Load(pre + o + c), Load(bias + c), &b));
      Store(biased + o + c, b);
    }
    if (rest > 0) {
      StoreTail(out + o + full, ForwardBlock(Tail(pre + o + full, rest), Tail(bias + full, rest), &b), rest);
      StoreTail(biased + o + full, b, rest);
    }
  }
}

DILOCO_SIMD_INLINE void BackwardBody(const float* biased, const float* grad_out, int64_t cols, int64_t begin,
                                     int64_t end, float* grad_in) {
  const int64_t full = cols / 8 * 8, rest = cols - full;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t o = r * cols;
    for (int64_t c = 0; c < full; c += 8) {
      Store(grad_in + o + c, BackwardBlock(Load(biased + o + c), Load(grad_out + o + c)));
    }
    if (rest > 0) {
      StoreTail(grad_in + o + full, BackwardBlock(Tail(biased + o + full, rest), Tail(grad_out + o + full, rest)),
                rest);
    }
  }
}

__attribute__((target("avx2,fma"))) void ForwardAvx2(const float* pre, const float* bias, int64_t cols,
                                                     int64_t begin, int64_t end, float* biased, float* out) {
  ForwardBody(pre, bias, cols, begin, end, biased, out);
}
__attribute__((target("avx2,fma"))) void BackwardAvx2(const float* biased, const float* grad_out, int64_t cols,
                                                      int64_t begin, int64_t end, float* grad_in) {
  BackwardBody(biased, grad_out, cols, begin, end, grad_in);
}
void ForwardBaseline(const float* pre, const float* bias, int64_t cols, int64_t begin, int64_t end, float* biased,
                     float* out) {
  ForwardBody(pre, bias, cols, begin, end, biased, out);
}
void BackwardBaseline(const float* biased, const float* grad_out, int64_t cols, int64_t begin, int64_t end,
                      float* grad_in) {
  BackwardBody(biased, grad_out, cols, begin, end, grad_in);
}

}  // namespace

void Forward(const float* pre, const float* bias, int64_t cols, int64_t begin, int64_t end, float* biased,
             float* out) {
  if (UseAvx2Kernels()) {
    ForwardAvx2(pre, bias, cols, begin, end, biased, out);
  } else {
    ForwardBaseline(pre, bias, cols, begin, end, biased, out);
  }
}

void Backward(const float* biased, const float* grad_out, int64_t cols, int64_t begin, int64_t end, float* grad_in) {
  if (UseAvx2Kernels()) {
    BackwardAvx2(biased, grad_out, cols, begin, end, grad_in);
  } else {
    BackwardBaseline(biased, grad_out, cols, begin, end, grad_in);
  }
}

}  // namespace diloco::gelu
