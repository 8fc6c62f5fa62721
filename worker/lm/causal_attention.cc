#include "worker/lm/causal_attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "worker/lm/causal_attention_kernels.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

struct Shape {
  int64_t B, T, D, n_head, hd, n_kv_head;
  int64_t Width() const { return (n_head + 2 * n_kv_head) * hd; }  // floats per position of the projection
};

// qkv [B, T, (n_head + 2 n_kv_head) x hd]; D = n_head x hd.
Shape ShapeOf(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head) {
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0) {
    throw std::invalid_argument("CausalSelfAttention: n_head must be a positive multiple of n_kv_head");
  }
  if (qkv.dim() != 3 || qkv.size(2) % (n_head + 2 * n_kv_head) != 0) {
    throw std::invalid_argument(n_head == n_kv_head
                                    ? "CausalSelfAttention: qkv must be [B, T, 3 x D]"
                                    : "CausalSelfAttention: qkv must be [B, T, (n_head + 2 n_kv_head) x hd]");
  }
  const int64_t hd = qkv.size(2) / (n_head + 2 * n_kv_head);
  return {qkv.size(0), qkv.size(1), n_head * hd, n_head, hd, n_kv_head};
}

attention::HeadShape HeadShapeOf(const Shape& s, const torch::Tensor& cos, const torch::Tensor& sin) {
  attention::HeadShape head{s.T, s.hd, s.Width(), s.D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)))};
  if (cos.defined()) {
    head.cos = cos.data_ptr<float>();
    head.sin = sin.data_ptr<float>();
  }
  return head;
}

// Offsets of query head h and of its key and value heads in one position's row of the projection.
struct HeadOffsets {
  int64_t q, k, v;
};
HeadOffsets OffsetsOf(const Shape& s, int64_t h) {
  const int64_t kv_head = h / (s.n_head / s.n_kv_head);
  return {h * s.hd, s.D + kv_head * s.hd, s.D + (s.n_kv_head + kv_head) * s.hd};
}

// qkv contiguous float32 on CPU -> (out [B, T, D], probs [B, n_head, T_pad, T_pad]).
std::pair<torch::Tensor, torch::Tensor> Forward(const torch::Tensor& qkv, const Shape& s,
                                                const attention::HeadShape& head) {
  const int64_t Tp = attention::Padded(s.T);
  torch::Tensor out = torch::empty({s.B, s.T, s.D}, qkv.options());
  torch::Tensor probs = torch::empty({s.B, s.n_head, Tp, Tp}, qkv.options());
  const float* in = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  float* p = probs.data_ptr<float>();
  at::parallel_for(0, s.B * s.n_head, 1, [&](int64_t begin, int64_t end) {
    attention::AttentionScratch scratch(head);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.n_head, h = bh % s.n_head;
      const float* row = in + b * s.T * s.Width();
      const HeadOffsets at = OffsetsOf(s, h);
      attention::ForwardHead(head, row + at.q, row + at.k, row + at.v, o + b * s.T * s.D + h * s.hd, p + bh * Tp * Tp,
                             scratch);
    }
  });
  return {out, probs};
}

// Parallel over (batch, key/value head): the query heads that share a key/value head add to its gradient in turn.
torch::Tensor Backward(const torch::Tensor& qkv, const torch::Tensor& probs, const torch::Tensor& d_out, const Shape& s,
                       const attention::HeadShape& head) {
  const int64_t Tp = attention::Padded(s.T), group = s.n_head / s.n_kv_head;
  torch::Tensor d_qkv = torch::empty_like(qkv);
  const float* in = qkv.data_ptr<float>();
  const float* p = probs.data_ptr<float>();
  const float* g = d_out.data_ptr<float>();
  float* dg = d_qkv.data_ptr<float>();
  at::parallel_for(0, s.B * s.n_kv_head, 1, [&](int64_t begin, int64_t end) {
    attention::AttentionScratch scratch(head);
    for (int64_t bk = begin; bk < end; ++bk) {
      const int64_t b = bk / s.n_kv_head, kv_head = bk % s.n_kv_head;
      const int64_t row = b * s.T * s.Width();
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = kv_head * group + j, bh = b * s.n_head + h;
        const HeadOffsets at = OffsetsOf(s, h);
        attention::BackwardHead(head, in + row + at.q, in + row + at.k, in + row + at.v, g + b * s.T * s.D + h * s.hd,
                                p + bh * Tp * Tp, dg + row + at.q, dg + row + at.k, dg + row + at.v, scratch,
                                /*accumulate_kv=*/j > 0);
      }
    }
  });
  return d_qkv;
}

// Rotary tables as the kernel reads them: contiguous float32 [T, hd], or undefined.
torch::Tensor TableOf(const torch::Tensor& table, const Shape& s) {
  if (!table.defined()) return table;
  if (table.dim() != 2 || table.size(0) != s.T || table.size(1) != s.hd || s.hd % 2 != 0) {
    throw std::invalid_argument("CausalSelfAttention: rotary tables must be [T, hd] with an even hd");
  }
  return table.contiguous();
}

// The rotary tables, handed to the autograd function as one non-tensor argument (they need no gradient, and LibTorch
// 1.13's Function::apply cannot take an undefined tensor argument).
struct Tables {
  torch::Tensor cos, sin;
};

class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv, int64_t n_head,
                               int64_t n_kv_head, const Tables& tables) {
    const torch::Tensor& cos = tables.cos;
    const torch::Tensor& sin = tables.sin;
    RECORD_FUNCTION("diloco::CausalSelfAttention", std::vector<c10::IValue>());  // named in profiles
    const Shape s = ShapeOf(qkv, n_head, n_kv_head);
    const torch::Tensor input = qkv.contiguous(), c = TableOf(cos, s), sn = TableOf(sin, s);
    auto [out, probs] = Forward(input, s, HeadShapeOf(s, c, sn));
    ctx->save_for_backward({input});
    ctx->saved_data["probs"] = probs;
    ctx->saved_data["n_head"] = n_head;
    ctx->saved_data["n_kv_head"] = n_kv_head;
    ctx->saved_data["cos"] = c;
    ctx->saved_data["sin"] = sn;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The backward pass is plain loops, not differentiable ops: refuse create_graph rather than return zero
    // second-order gradients.
    TORCH_CHECK(!torch::GradMode::is_enabled(), "CausalSelfAttention: no double backward (create_graph)");
    const torch::Tensor qkv = ctx->get_saved_variables()[0];
    const torch::Tensor probs = ctx->saved_data["probs"].toTensor();
    const Shape s = ShapeOf(qkv, ctx->saved_data["n_head"].toInt(), ctx->saved_data["n_kv_head"].toInt());
    const torch::Tensor cos = ctx->saved_data["cos"].toTensor(), sin = ctx->saved_data["sin"].toTensor();
    return {Backward(qkv, probs, grads[0].contiguous(), s, HeadShapeOf(s, cos, sin)), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// q [B, T, n_head, hd], k [B, T, n_kv_head, hd] of the projection, rotated when cos is defined; then the key/value
// heads repeated to n_head heads: q, k, v [B, n_head, T, hd] for the composite ops and SDPA.
std::array<torch::Tensor, 3> HeadsOf(const torch::Tensor& qkv, const Shape& s, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t kv = s.n_kv_head * s.hd, group = s.n_head / s.n_kv_head;
  torch::Tensor q = qkv.narrow(-1, 0, s.D).view({s.B, s.T, s.n_head, s.hd});
  torch::Tensor k = qkv.narrow(-1, s.D, kv).view({s.B, s.T, s.n_kv_head, s.hd});
  torch::Tensor v = qkv.narrow(-1, s.D + kv, kv).view({s.B, s.T, s.n_kv_head, s.hd});
  if (cos.defined()) {
    q = RotateHalf(q, cos, sin);
    k = RotateHalf(k, cos, sin);
  }
  if (group > 1) {
    k = k.repeat_interleave(group, 2);
    v = v.repeat_interleave(group, 2);
  }
  return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};
}

torch::Tensor Reference(const torch::Tensor& qkv, const Shape& s, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto [q, k, v] = HeadsOf(qkv, s, cos, sin);
  auto mask = torch::full({s.T, s.T}, -std::numeric_limits<float>::infinity(), qkv.options()).triu(1);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(s.hd))) + mask;
  return torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({s.B, s.T, s.D});
}

torch::Tensor Attention(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const Shape s = ShapeOf(qkv, n_head, n_kv_head);
  if (!UseFusedKernels()) return Reference(qkv, s, cos, sin);
  if (qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat && !(torch_compat::kHasSdpa && PreferSdpaOnCpu())) {
    return CausalAttentionFunction::apply(qkv, n_head, n_kv_head, Tables{cos, sin});
  }
  if (!torch_compat::kHasSdpa) return Reference(qkv, s, cos, sin);
  // LibTorch 2.x on CUDA (flash / memory-efficient kernels) and for other dtypes: scaled_dot_product_attention.
  auto [q, k, v] = HeadsOf(qkv, s, cos, sin);
  return torch_compat::CausalSdpa(q, k, v).transpose(1, 2).reshape({s.B, s.T, s.D});
}

}  // namespace

torch::Tensor RotateHalf(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

torch::Tensor CausalSelfAttentionReference(const torch::Tensor& qkv, int64_t n_head) {
  return Reference(qkv, ShapeOf(qkv, n_head, n_head), {}, {});
}

torch::Tensor CausalSelfAttention(const torch::Tensor& qkv, int64_t n_head) {
  return Attention(qkv, n_head, n_head, {}, {});
}

torch::Tensor GroupedCausalAttention(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                     const torch::Tensor& cos, const torch::Tensor& sin) {
  return Attention(qkv, n_head, n_kv_head, cos, sin);
}

torch::Tensor GroupedCausalAttentionReference(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                              const torch::Tensor& cos, const torch::Tensor& sin) {
  return Reference(qkv, ShapeOf(qkv, n_head, n_kv_head), cos, sin);
}

torch::Tensor CachedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, KvCache& cache,
                              size_t layer, int64_t window) {
  if (cache.keys.size() <= layer) {
    cache.keys.resize(layer + 1);
    cache.values.resize(layer + 1);
  }
  torch::Tensor& keys = cache.keys[layer];
  torch::Tensor& values = cache.values[layer];
  keys = keys.defined() ? torch::cat({keys, k}, 2) : k.contiguous();
  values = values.defined() ? torch::cat({values, v}, 2) : v.contiguous();
  const int64_t B = q.size(0), n_head = q.size(1), T_new = q.size(2), hd = q.size(3);
  const int64_t S = keys.size(2), start = S - T_new, group = n_head / keys.size(1);
  torch::Tensor kk = group == 1 ? keys : keys.repeat_interleave(group, 1);  // [B, n_head, S, hd]
  torch::Tensor vv = group == 1 ? values : values.repeat_interleave(group, 1);
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  const torch::Tensor key_pos = torch::arange(S, opts).unsqueeze(0);                  // [1, S]
  const torch::Tensor query_pos = (torch::arange(T_new, opts) + start).unsqueeze(1);  // [T_new, 1]
  torch::Tensor hidden = key_pos > query_pos;
  if (window > 0) hidden = hidden.logical_or(key_pos <= query_pos - window);
  torch::Tensor scores = torch::matmul(q, kk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vv).transpose(1, 2).reshape({B, T_new, n_head * hd});
}

torch::Tensor CachedAttention(const torch::Tensor& qkv, int64_t n_head, KvCache& cache, size_t layer) {
  const Shape s = ShapeOf(qkv, n_head, n_head);
  auto parts = qkv.view({s.B, s.T, 3, s.n_head, s.hd}).permute({2, 0, 3, 1, 4});  // q, k, v: [B, h, T, hd]
  return CachedAttention(parts[0], parts[1], parts[2], cache, layer);
}

}  // namespace diloco
