// The float loops behind CausalSelfAttention (worker/lm/causal_attention.h), one (batch, head) per call, on raw
// pointers (no LibTorch here). Each call works in a caller-owned AttentionScratch sized for (T, head_dim): padded
// copies of the head's rows kept in cache, multiplied with a register-blocked 4 x 16 kernel that skips the masked
// half. Built for AVX2+FMA and for the baseline x86-64 (kernel_dispatch.h picks one). Pure functions of their
// arguments: thread-safe as long as each thread has its own scratch.
#pragma once

#include <cstdint>
#include <vector>

namespace diloco::attention {

// Rows and columns padded to a multiple of 16 (the kernel's width); padding is kept at zero.
int64_t Padded(int64_t n);

struct HeadShape {
  int64_t T;           // sequence length
  int64_t head_dim;    // hd
  int64_t qkv_stride;  // floats between consecutive positions in qkv and its gradient ((n_head + 2 n_kv_head) x hd)
  int64_t out_stride;  // ... in the output and its gradient (n_head x hd)
  float scale;         // 1 / sqrt(hd)
  // Rotary position tables [T][hd] (rows hd apart) or null: when set, q and k are read as RoPE(q), RoPE(k) with
  // RoPE(x) = x cos + [-x2, x1] sin (x1, x2 the halves of a row), and dq, dk are the gradients of the unrotated rows.
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// Per-thread working memory for one head at a time.
class AttentionScratch {
 public:
  explicit AttentionScratch(const HeadShape& shape);
  float* q() { return buffers_[0].data(); }
  float* k() { return buffers_[1].data(); }
  float* v() { return buffers_[2].data(); }
  float* d_out() { return buffers_[3].data(); }
  float* transposed() { return buffers_[4].data(); }  // K^T or V^T: [hd_pad][T_pad]
  float* result() { return buffers_[5].data(); }      // O or dQ: [T_pad][hd_pad]
  float* result2() { return buffers_[6].data(); }     // dK
  float* result3() { return buffers_[7].data(); }     // dV
  float* square() { return buffers_[8].data(); }      // dP, then dS: [T_pad][T_pad]

 private:
  std::vector<std::vector<float>> buffers_;
};

// q, k, v: the head's first element in the qkv tensor (position 0), rows qkv_stride apart; out rows out_stride apart.
// probs: [T_pad][T_pad], written whole (rows >= T and columns > row are zero): the softmax the backward pass needs.
void ForwardHead(const HeadShape& shape, const float* q, const float* k, const float* v, float* out, float* probs,
                 AttentionScratch& scratch);

// d_out: the head's output-gradient rows (out_stride); probs from ForwardHead; writes dq, dk, dv rows (qkv_stride).
// With accumulate_kv, dk and dv are added to what is there (the query heads of one grouped key/value head, in turn).
void BackwardHead(const HeadShape& shape, const float* q, const float* k, const float* v, const float* d_out,
                  const float* probs, float* dq, float* dk, float* dv, AttentionScratch& scratch,
                  bool accumulate_kv = false);

}  // namespace diloco::attention
