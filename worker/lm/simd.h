// Eight-float vectors for the hand-written CPU kernels (worker/lm/*_kernels.cc): GCC's vector extension, one AVX
// register in a function built with target("avx2,fma"), two SSE registers elsewhere; and the few vector functions
// those kernels need. Everything is always inlined, so each kernel compiles it for its own target. Include only
// from kernel .cc files built with -Wno-psabi (the 32-byte types never cross a non-inlined call).
#pragma once

#include <cstdint>
#include <cstring>

namespace diloco::simd {

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));

#define DILOCO_SIMD_INLINE inline __attribute__((always_inline))

DILOCO_SIMD_INLINE V8 Load(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
DILOCO_SIMD_INLINE void Store(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }
DILOCO_SIMD_INLINE V8 Splat(float x) { return V8{} + x; }  // a scalar operand is broadcast
DILOCO_SIMD_INLINE float Sum(V8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// exp(x) for x <= 0, Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for e^r, 2^n built in
// the exponent bits (the attention tests hold the softmax built on it to float64 within float rounding). Inputs below
// -87 give exp(-87) ~ 1.6e-38 instead of something smaller: next to the values these kernels add it to, nothing.
DILOCO_SIMD_INLINE V8 ExpNonPositive(V8 x) {
  x = x < Splat(-87.0f) ? Splat(-87.0f) : x;
  const V8 magic = Splat(12582912.0f);  // 1.5 x 2^23: adding it rounds to an integer held in the low mantissa bits
  const V8 t = x * Splat(1.44269504088896341f) + magic;
  const V8 n = t - magic;
  const V8 r = (x - n * Splat(0.693359375f)) - n * Splat(-2.12194440e-4f);
  V8 p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * r * r + r + Splat(1.0f);
  I8 bits;
  std::memcpy(&bits, &t, sizeof(bits));
  // n + 127 in the exponent field: 2^n (shifted unsigned: for the positive inputs of masked columns, whose results
  // the callers discard, the value may leave the exponent's range).
  const U8 exponent = (U8)(bits - 0x4B400000 + 127) << 23;  // a vector cast of equal size: the same bits
  V8 two_n;
  std::memcpy(&two_n, &exponent, sizeof(two_n));
  return p * two_n;
}

}  // namespace diloco::simd
