#include "worker/lm/causal_attention_kernels.h"

#include <algorithm>
#include <cstring>

#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/simd.h"

namespace diloco::attention {
namespace {

using simd::Load;
using simd::Splat;
using simd::Store;
using simd::V8;

// c[4 x 16] (row stride ldc) = sum over k in [k0, k1) of a[r][k] b[k][0..16): b row-major (ldb), a row-major (lda)
// or, with kTransposedA, a stored transposed (a[r][k] at a[k * lda + r]). Eight accumulators stay in registers.
template <bool kTransposedA>
DILOCO_SIMD_INLINE void Kernel4x16(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k0, int64_t k1,
                                   float* c, int64_t ldc) {
  V8 acc[4][2] = {};
  for (int64_t k = k0; k < k1; ++k) {
    const V8 b0 = Load(b + k * ldb), b1 = Load(b + k * ldb + 8);
    for (int r = 0; r < 4; ++r) {
      const V8 ar = Splat(kTransposedA ? a[k * lda + r] : a[r * lda + k]);
      acc[r][0] += ar * b0;
      acc[r][1] += ar * b1;
    }
  }
  for (int r = 0; r < 4; ++r) {
    Store(c + r * ldc, acc[r][0]);
    Store(c + r * ldc + 8, acc[r][1]);
  }
}

// Causal a b^T: s[i][j] = sum_d a[i][d] bt[d][j] for the 4 x 16 blocks that hold some j <= i (rows < T).
DILOCO_SIMD_INLINE void CausalProduct(const float* a, const float* bt, int64_t T, int64_t hd, int64_t hdp, int64_t Tp,
                                      float* s) {
  for (int64_t r0 = 0; r0 < T; r0 += 4) {
    const int64_t last_column = std::min(r0 + 4, T);
    for (int64_t c0 = 0; c0 < last_column; c0 += 16) {
      Kernel4x16<false>(a + r0 * hdp, hdp, bt + c0, Tp, 0, hd, s + r0 * Tp + c0, Tp);
    }
  }
}

// out[i][0..hd) = sum over k of m[i][k] rows[k][0..hd), four rows i at a time, for a lower-triangular m [Tp][Tp]
// (k <= i: k in [0, r0 + 4)); with kTransposedM, for m^T where m is lower-triangular (k >= i: k in [r0, T)).
template <bool kTransposedM>
DILOCO_SIMD_INLINE void TriangularTimesRows(const float* m, const float* rows, int64_t T, int64_t hd, int64_t hdp,
                                            int64_t Tp, float* out) {
  for (int64_t r0 = 0; r0 < T; r0 += 4) {
    const int64_t k0 = kTransposedM ? r0 : 0, k1 = kTransposedM ? T : std::min(r0 + 4, T);
    const float* a = kTransposedM ? m + r0 : m + r0 * Tp;
    for (int64_t c0 = 0; c0 < hd; c0 += 16) {
      Kernel4x16<kTransposedM>(a, Tp, rows + c0, hdp, k0, k1, out + r0 * hdp + c0, hdp);
    }
  }
}

void LoadRows(const float* src, int64_t T, int64_t hd, int64_t stride, int64_t hdp, float* dst) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * hdp, src + t * stride, sizeof(float) * hd);
}

void LoadTransposed(const float* src, int64_t T, int64_t hd, int64_t stride, int64_t Tp, float* dst) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < hd; ++d) dst[d * Tp + t] = src[t * stride + d];
  }
}

void StoreRows(const float* src, int64_t T, int64_t hd, int64_t hdp, int64_t stride, float* dst) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * stride, src + t * hdp, sizeof(float) * hd);
}

// Row t of src rotated by RoPE into row (hd floats): x cos + [-x2, x1] sin, the operations of transformers'
// apply_rotary_pos_emb in the same order.
DILOCO_SIMD_INLINE void RotateRow(const float* src, const float* cos, const float* sin, int64_t hd, float* row) {
  const int64_t half = hd / 2;
  for (int64_t d = 0; d < half; ++d) row[d] = src[d] * cos[d] + -src[d + half] * sin[d];
  for (int64_t d = half; d < hd; ++d) row[d] = src[d] * cos[d] + src[d - half] * sin[d];
}

// LoadRows / LoadTransposed of RoPE(src) when shape.cos is set.
DILOCO_SIMD_INLINE void LoadQk(const HeadShape& shape, const float* src, bool transposed, float* dst,
                               float* row_scratch) {
  const int64_t T = shape.T, hd = shape.head_dim, stride = shape.qkv_stride;
  if (shape.cos == nullptr) {
    transposed ? LoadTransposed(src, T, hd, stride, Padded(T), dst) : LoadRows(src, T, hd, stride, Padded(hd), dst);
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    float* row = transposed ? row_scratch : dst + t * Padded(hd);
    RotateRow(src + t * stride, shape.cos + t * hd, shape.sin + t * hd, hd, row);
    if (transposed) {
      for (int64_t d = 0; d < hd; ++d) dst[d * Padded(T) + t] = row[d];
    }
  }
}

// Stores (or adds, with accumulate) the gradient rows g [T][hdp] of RoPE(x) as the gradient of x when shape.cos is
// set: dx1 = g1 cos1 + g2 sin2, dx2 = g2 cos2 - g1 sin1; else g itself.
DILOCO_SIMD_INLINE void StoreQkGrad(const HeadShape& shape, const float* g, bool accumulate, float* dst) {
  const int64_t T = shape.T, hd = shape.head_dim, hdp = Padded(hd), half = hd / 2, stride = shape.qkv_stride;
  if (shape.cos == nullptr && !accumulate) return StoreRows(g, T, hd, hdp, stride, dst);
  for (int64_t t = 0; t < T; ++t) {
    const float* r = g + t * hdp;
    float* out = dst + t * stride;
    if (shape.cos == nullptr) {
      for (int64_t d = 0; d < hd; ++d) out[d] += r[d];
      continue;
    }
    const float* c = shape.cos + t * hd;
    const float* s = shape.sin + t * hd;
    for (int64_t d = 0; d < hd; ++d) {
      const float dx = d < half ? r[d] * c[d] + r[d + half] * s[d + half] : r[d] * c[d] - r[d - half] * s[d - half];
      out[d] = accumulate ? out[d] + dx : dx;
    }
  }
}

}  // namespace

int64_t Padded(int64_t n) { return (n + 15) / 16 * 16; }

AttentionScratch::AttentionScratch(const HeadShape& shape) {
  const size_t rows = static_cast<size_t>(Padded(shape.T) * Padded(shape.head_dim));
  const size_t square = static_cast<size_t>(Padded(shape.T) * Padded(shape.T));
  buffers_.assign(8, std::vector<float>(rows, 0.0f));
  buffers_.emplace_back(square, 0.0f);
}

namespace {

DILOCO_SIMD_INLINE void ForwardHeadBody(const HeadShape& shape, const float* q, const float* k, const float* v,
                                        float* out, float* probs, AttentionScratch& scratch) {
  const int64_t T = shape.T, hd = shape.head_dim, Tp = Padded(T), hdp = Padded(hd), stride = shape.qkv_stride,
                out_stride = shape.out_stride;
  float* Q = scratch.q();
  float* KT = scratch.transposed();
  float* V = scratch.v();
  float* O = scratch.result();
  // Rows >= T and columns >= hd of the scratch stay zero from construction: only [0, T) x [0, hd) is written.
  LoadQk(shape, q, /*transposed=*/false, Q, O);
  LoadQk(shape, k, /*transposed=*/true, KT, O);
  LoadRows(v, T, hd, stride, hdp, V);

  CausalProduct(Q, KT, T, hd, hdp, Tp, probs);
  for (int64_t i = 0; i < T; ++i) {
    float* row = probs + i * Tp;
    const int64_t n = i + 1, n8 = (n + 7) / 8 * 8;  // the block of 8 past the diagonal was computed (zero-padded)
    float max = row[0];
    for (int64_t j = 1; j < n; ++j) max = std::max(max, row[j]);
    const V8 scale = Splat(shape.scale), shift = Splat(max * shape.scale);
    V8 sum = {};
    for (int64_t j = 0; j < n8; j += 8) {
      V8 e = simd::ExpNonPositive(Load(row + j) * scale - shift);
      if (j + 8 > n) {  // zero the masked columns of the last block
        for (int64_t u = n - j; u < 8; ++u) e[u] = 0.0f;
      }
      Store(row + j, e);
      sum += e;
    }
    const V8 inverse = Splat(1.0f / simd::Sum(sum));
    for (int64_t j = 0; j < n8; j += 8) Store(row + j, Load(row + j) * inverse);
    std::fill(row + n8, row + Tp, 0.0f);
  }
  std::fill(probs + T * Tp, probs + Tp * Tp, 0.0f);

  TriangularTimesRows<false>(probs, V, T, hd, hdp, Tp, O);
  StoreRows(O, T, hd, hdp, out_stride, out);
}

DILOCO_SIMD_INLINE void BackwardHeadBody(const HeadShape& shape, const float* q, const float* k, const float* v,
                                         const float* d_out, const float* probs, float* dq, float* dk, float* dv,
                                         AttentionScratch& scratch, bool accumulate_kv) {
  const int64_t T = shape.T, hd = shape.head_dim, Tp = Padded(T), hdp = Padded(hd), stride = shape.qkv_stride,
                out_stride = shape.out_stride;
  float* Q = scratch.q();
  float* K = scratch.k();
  float* dO = scratch.d_out();
  float* VT = scratch.transposed();
  float* dS = scratch.square();
  LoadQk(shape, q, /*transposed=*/false, Q, nullptr);
  LoadQk(shape, k, /*transposed=*/false, K, nullptr);
  LoadRows(d_out, T, hd, out_stride, hdp, dO);
  LoadTransposed(v, T, hd, stride, Tp, VT);

  // dP = dO V^T (causal part); dS = P (dP - rowsum(P dP)) x scale, zero above the diagonal and below row T.
  CausalProduct(dO, VT, T, hd, hdp, Tp, dS);
  for (int64_t i = 0; i < T; ++i) {
    float* row = dS + i * Tp;
    const float* p = probs + i * Tp;
    // Blocks of 8 up to the one holding the diagonal: p is zero past the diagonal, so those columns give zero.
    const int64_t n8 = (i + 8) / 8 * 8;
    V8 dots = {};
    for (int64_t j = 0; j < n8; j += 8) dots += Load(p + j) * Load(row + j);
    const float dot = simd::Sum(dots);
    for (int64_t j = 0; j < n8; j += 8) Store(row + j, Load(p + j) * (Load(row + j) - dot) * shape.scale);
    std::fill(row + n8, row + Tp, 0.0f);
  }
  std::fill(dS + T * Tp, dS + Tp * Tp, 0.0f);

  // dQ = dS K; dK = dS^T Q; dV = P^T dO.
  float* dQ = scratch.result();
  float* dK = scratch.result2();
  float* dV = scratch.result3();
  TriangularTimesRows<false>(dS, K, T, hd, hdp, Tp, dQ);
  TriangularTimesRows<true>(dS, Q, T, hd, hdp, Tp, dK);
  TriangularTimesRows<true>(probs, dO, T, hd, hdp, Tp, dV);
  StoreQkGrad(shape, dQ, /*accumulate=*/false, dq);
  StoreQkGrad(shape, dK, accumulate_kv, dk);
  if (!accumulate_kv) return StoreRows(dV, T, hd, hdp, stride, dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < hd; ++d) dv[t * stride + d] += dV[t * hdp + d];
  }
}

// The bodies compiled twice: for CPUs with AVX2 and FMA (8-wide fused multiply-adds, 16 vector registers for the
// kernel's accumulators), and for the x86-64 baseline; chosen once per process.
__attribute__((target("avx2,fma"))) void ForwardHeadAvx2(const HeadShape& shape, const float* q, const float* k,
                                                         const float* v, float* out, float* probs,
                                                         AttentionScratch& scratch) {
  ForwardHeadBody(shape, q, k, v, out, probs, scratch);
}
__attribute__((target("avx2,fma"))) void BackwardHeadAvx2(const HeadShape& shape, const float* q, const float* k,
                                                          const float* v, const float* d_out, const float* probs,
                                                          float* dq, float* dk, float* dv, AttentionScratch& scratch,
                                                          bool accumulate_kv) {
  BackwardHeadBody(shape, q, k, v, d_out, probs, dq, dk, dv, scratch, accumulate_kv);
}
void ForwardHeadBaseline(const HeadShape& shape, const float* q, const float* k, const float* v, float* out,
                         float* probs, AttentionScratch& scratch) {
  ForwardHeadBody(shape, q, k, v, out, probs, scratch);
}
void BackwardHeadBaseline(const HeadShape& shape, const float* q, const float* k, const float* v, const float* d_out,
                          const float* probs, float* dq, float* dk, float* dv, AttentionScratch& scratch,
                          bool accumulate_kv) {
  BackwardHeadBody(shape, q, k, v, d_out, probs, dq, dk, dv, scratch, accumulate_kv);
}

}  // namespace

void ForwardHead(const HeadShape& shape, const float* q, const float* k, const float* v, float* out, float* probs,
                 AttentionScratch& scratch) {
  if (UseAvx2Kernels()) {
    ForwardHeadAvx2(shape, q, k, v, out, probs, scratch);
  } else {
    ForwardHeadBaseline(shape, q, k, v, out, probs, scratch);
  }
}

void BackwardHead(const HeadShape& shape, const float* q, const float* k, const float* v, const float* d_out,
                  const float* probs, float* dq, float* dk, float* dv, AttentionScratch& scratch, bool accumulate_kv) {
  if (UseAvx2Kernels()) {
    BackwardHeadAvx2(shape, q, k, v, d_out, probs, dq, dk, dv, scratch, accumulate_kv);
  } else {
    BackwardHeadBaseline(shape, q, k, v, d_out, probs, dq, dk, dv, scratch, accumulate_kv);
  }
}

}  // namespace diloco::attention
