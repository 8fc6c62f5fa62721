#include "worker/lm/causal_attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "worker/lm/causal_attention_kernels.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

struct Shape {
  int64_t B, T, D, n_head, hd;
};

Shape ShapeOf(const torch::Tensor& qkv, int64_t n_head) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) {
    throw std::invalid_argument("CausalSelfAttention: qkv must be [B, T, 3 x D]");
  }
  const int64_t D = qkv.size(2) / 3;
  if (n_head <= 0 || D % n_head != 0) throw std::invalid_argument("CausalSelfAttention: D not divisible by n_head");
  return {qkv.size(0), qkv.size(1), D, n_head, D / n_head};
}

attention::HeadShape HeadShapeOf(const Shape& s) {
  return {s.T, s.hd, 3 * s.D, s.D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)))};
}

// qkv contiguous float32 on CPU -> (out [B, T, D], probs [B, n_head, T_pad, T_pad]).
std::pair<torch::Tensor, torch::Tensor> Forward(const torch::Tensor& qkv, const Shape& s) {
  const int64_t Tp = attention::Padded(s.T);
  torch::Tensor out = torch::empty({s.B, s.T, s.D}, qkv.options());
  torch::Tensor probs = torch::empty({s.B, s.n_head, Tp, Tp}, qkv.options());
  const attention::HeadShape head = HeadShapeOf(s);
  const float* in = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  float* p = probs.data_ptr<float>();
  at::parallel_for(0, s.B * s.n_head, 1, [&](int64_t begin, int64_t end) {
    attention::AttentionScratch scratch(head);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.n_head, h = bh % s.n_head;
      const float* q = in + b * s.T * 3 * s.D + h * s.hd;
      attention::ForwardHead(head, q, q + s.D, q + 2 * s.D, o + b * s.T * s.D + h * s.hd, p + bh * Tp * Tp, scratch);
    }
  });
  return {out, probs};
}

torch::Tensor Backward(const torch::Tensor& qkv, const torch::Tensor& probs, const torch::Tensor& d_out,
                       const Shape& s) {
  const int64_t Tp = attention::Padded(s.T);
  torch::Tensor d_qkv = torch::empty_like(qkv);
  const attention::HeadShape head = HeadShapeOf(s);
  const float* in = qkv.data_ptr<float>();
  const float* p = probs.data_ptr<float>();
  const float* g = d_out.data_ptr<float>();
  float* dg = d_qkv.data_ptr<float>();
  at::parallel_for(0, s.B * s.n_head, 1, [&](int64_t begin, int64_t end) {
    attention::AttentionScratch scratch(head);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.n_head, h = bh % s.n_head;
      const int64_t qkv_offset = b * s.T * 3 * s.D + h * s.hd;
      attention::BackwardHead(head, in + qkv_offset, in + qkv_offset + s.D, in + qkv_offset + 2 * s.D,
                              g + b * s.T * s.D + h * s.hd, p + bh * Tp * Tp, dg + qkv_offset, dg + qkv_offset + s.D,
                              dg + qkv_offset + 2 * s.D, scratch);
    }
  });
  return d_qkv;
}

class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv, int64_t n_head) {
    RECORD_FUNCTION("diloco::CausalSelfAttention", std::vector<c10::IValue>());  // named in profiles
    const Shape s = ShapeOf(qkv, n_head);
    torch::Tensor input = qkv.contiguous();
    auto [out, probs] = Forward(input, s);
    ctx->save_for_backward({qkv});
    ctx->saved_data["probs"] = probs;
    ctx->saved_data["n_head"] = n_head;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The backward pass is plain loops, not differentiable ops: refuse create_graph rather than return zero
    // second-order gradients.
    TORCH_CHECK(!torch::GradMode::is_enabled(), "CausalSelfAttention: no double backward (create_graph)");
    const torch::Tensor qkv = ctx->get_saved_variables()[0].contiguous();
    const torch::Tensor probs = ctx->saved_data["probs"].toTensor();
    const Shape s = ShapeOf(qkv, ctx->saved_data["n_head"].toInt());
    return {Backward(qkv, probs, grads[0].contiguous(), s), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CausalSelfAttentionReference(const torch::Tensor& qkv, int64_t n_head) {
  const Shape s = ShapeOf(qkv, n_head);
  auto parts = qkv.view({s.B, s.T, 3, s.n_head, s.hd}).permute({2, 0, 3, 1, 4});  // q, k, v: [B, h, T, hd]
  auto q = parts[0], k = parts[1], v = parts[2];
  auto mask = torch::full({s.T, s.T}, -std::numeric_limits<float>::infinity(), qkv.options()).triu(1);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(s.hd))) + mask;
  return torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({s.B, s.T, s.D});
}

torch::Tensor CausalSelfAttention(const torch::Tensor& qkv, int64_t n_head) {
  if (!UseFusedKernels()) return CausalSelfAttentionReference(qkv, n_head);
  if (qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat && !(torch_compat::kHasSdpa && PreferSdpaOnCpu())) {
    return CausalAttentionFunction::apply(qkv, n_head);
  }
  if (!torch_compat::kHasSdpa) return CausalSelfAttentionReference(qkv, n_head);
  // LibTorch 2.x on CUDA (flash / memory-efficient kernels) and for other dtypes: scaled_dot_product_attention.
  const Shape s = ShapeOf(qkv, n_head);
  auto parts = qkv.view({s.B, s.T, 3, s.n_head, s.hd}).permute({2, 0, 3, 1, 4});  // q, k, v: [B, h, T, hd]
  return torch_compat::CausalSdpa(parts[0], parts[1], parts[2]).transpose(1, 2).reshape({s.B, s.T, s.D});
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
  const Shape s = ShapeOf(qkv, n_head);
  auto parts = qkv.view({s.B, s.T, 3, s.n_head, s.hd}).permute({2, 0, 3, 1, 4});  // q, k, v: [B, h, T, hd]
  return CachedAttention(parts[0], parts[1], parts[2], cache, layer);
}

}  // namespace diloco
