// CausalSelfAttention: multi-head causal softmax attention read straight from a fused q/k/v projection, as one
// autograd op. qkv [B, T, 3 x D] holds q, k, v one after the other, each D = n_head x head_dim with the heads
// contiguous; the result is [B, T, D] with
//   out[b, t, head] = sum over s <= t of softmax_s(q[b, t, head] . k[b, s, head] / sqrt(head_dim)) v[b, s, head],
// the same numbers (to float rounding) as the composite ops in CausalSelfAttentionReference.
//
// Why: at the demo's sizes (64 products of 64 x 32 x 64 per layer) the composite ops run the attention at about a
// fifth of the machine's matmul peak (one small OpenBLAS call per head, plus six passes over the [B, h, T, T] scores);
// on CPU float32 this op computes each (batch, head) in cache with register-blocked loops, skips the masked half and
// keeps the probabilities for the backward pass. Other devices and dtypes (CUDA, bf16 autocast) take LibTorch's
// at::scaled_dot_product_attention on LibTorch 2.x (flash / memory-efficient kernels on CUDA) and the composite ops on
// 1.13. The AVX2+FMA and baseline builds of the kernel round differently (fused multiply-adds), so the last bits
// depend on the CPU, as OpenBLAS's do; no double backward (create_graph is refused). Stateless and thread-safe;
// parallel over (batch, head) with ATen's intra-op threads.
#pragma once

#include <torch/torch.h>

#include "worker/lm/kv_cache.h"

namespace diloco {

// qkv: [B, T, 3 x D], D divisible by n_head. Differentiable with respect to qkv.
torch::Tensor CausalSelfAttention(const torch::Tensor& qkv, int64_t n_head);

// The same attention as composite LibTorch ops (matmul, additive -inf mask, softmax): the fallback, and what the
// tests hold the fused op to.
torch::Tensor CausalSelfAttentionReference(const torch::Tensor& qkv, int64_t n_head);

// Grouped-query attention with rotary positions, read straight from a llama-family fused projection qkv
// [B, T, (n_head + 2 n_kv_head) x hd] = q | k | v (heads contiguous in each): query head h reads key/value head
// h / (n_head / n_kv_head), and q, k are rotated by RotateHalf with cos, sin [T, hd] (undefined: not rotated). The
// fused CPU kernel rotates rows as it loads them and reads each key/value head in place (no repeat, no copies of q, k,
// v); its gradient is one [B, T, (n_head + 2 n_kv_head) x hd] tensor. Differentiable with respect to qkv only.
torch::Tensor GroupedCausalAttention(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                     const torch::Tensor& cos, const torch::Tensor& sin);

// The same as composite ops (rotation, repeated key/value heads, matmul, mask, softmax).
torch::Tensor GroupedCausalAttentionReference(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                              const torch::Tensor& cos, const torch::Tensor& sin);

// transformers' apply_rotary_pos_emb for x [B, T, heads, hd], cos and sin [T, hd]: x cos + [-x2, x1] sin.
torch::Tensor RotateHalf(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// Incremental decoding: attention of new queries over the cached and new keys/values (composite ops; no grad).
// q: [B, n_head, T_new, hd]; k, v: [B, n_kv_head, T_new, hd] with n_head a multiple of n_kv_head (grouped-query
// attention: query head h reads key/value head h / (n_head / n_kv_head)). The new positions are cache.length ..
// cache.length + T_new - 1, causal among themselves; appends k, v to cache.keys/values[layer] (the caller advances
// cache.length once all layers ran). Returns [B, T_new, n_head x hd]. With window > 0 (mistral's sliding window) a
// query at position p sees only the keys at p - window + 1 .. p. Differentiable (composite ops): with an empty cache
// it is also the training path of a windowed attention.
torch::Tensor CachedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, KvCache& cache,
                              size_t layer, int64_t window = 0);

// The same from a fused projection qkv [B, T_new, 3 x D] laid out as CausalSelfAttention's (n_head heads each).
torch::Tensor CachedAttention(const torch::Tensor& qkv, int64_t n_head, KvCache& cache, size_t layer);

}  // namespace diloco
