// model.arch: llama — exactly Hugging Face's LlamaForCausalLM (transformers' modeling_llama.py), with its parameter
// names and shapes, so that this module's state dict is the Hugging Face checkpoint's:
//   model.embed_tokens.weight [vocab, D]
//   model.layers.<i>.self_attn.q_proj.weight [n_head x hd, D], {k,v}_proj.weight [n_kv_head x hd, D],
//   model.layers.<i>.self_attn.o_proj.weight [D, n_head x hd]                                    (no biases)
//   model.layers.<i>.mlp.{gate,up}_proj.weight [F, D], down_proj.weight [D, F]                    (F = FfnHidden())
//   model.layers.<i>.{input,post_attention}_layernorm.weight [D]
//   model.norm.weight [D], lm_head.weight [vocab, D] only when tie_embeddings is false.
// Per layer: h = x + o_proj(Attention(RoPE(q), RoPE(k), v)) of input_layernorm(x); out = h + down(silu(gate(y)) *
// up(y)) with y = post_attention_layernorm(h). RMSNorm in float32: w * x / sqrt(mean(x^2) + norm_eps). RoPE: hd = D /
// n_head or model.head_dim, cos/sin from worker/lm/rope.h (rope_type default, linear, llama3, yarn, dynamic), x * cos +
// rotate_half(x) * sin with rotate_half(x) = [-x2, x1]. Grouped-query attention: query head h reads key/value head h /
// (n_head / n_kv_head). Training and forward() use the fused CPU attention (worker/lm/causal_attention.h,
// GroupedCausalAttention) on the output of one q|k|v matrix product: it rotates q and k as it loads them and reads
// each key/value head in place, so no head is repeated and nothing is concatenated. ForwardCached keeps n_kv_head
// heads in the cache. With model.activation_checkpointing, training recomputes each layer in backward
// (worker/lm/checkpointed.h). The same code is mistral, qwen2 and qwen3 (worker/lm/llama_family.h: q/k/v biases,
// per-head q/k norms, a sliding window, which takes the composite masked attention of CachedAttention when it is
// shorter than the sequence).
#include <stdexcept>
#include <string>

#include "worker/lm/causal_attention.h"
#include "worker/lm/checkpointed.h"
#include "worker/lm/language_model.h"
#include "worker/lm/llama_family.h"
#include "worker/lm/rms_norm.h"
#include "worker/lm/rope.h"

namespace diloco {
namespace {

// RMSNorm with one gain vector "weight" [D] (Hugging Face's LlamaRMSNorm: normalised in float32; one fused op,
// worker/lm/rms_norm.h).
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t d, double eps) : eps_(eps) { weight_ = register_parameter("weight", torch::ones({d})); }

  torch::Tensor forward(const torch::Tensor& x) { return RmsNormForward(x, weight_, eps_); }

 private:
  double eps_;
  torch::Tensor weight_;
};
TORCH_MODULE(RmsNorm);

struct Rotary {
  torch::Tensor cos, sin;  // [T, hd]
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const ModelConfig& c, const LlamaVariant& variant)
      : n_head_(c.n_head), n_kv_head_(c.KvHeads()), hd_(c.HeadDim()), window_(c.sliding_window) {
    auto linear = [](int64_t in, int64_t out, bool bias) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
    };
    q_proj_ = register_module("q_proj", linear(c.d_model, n_head_ * hd_, variant.qkv_bias));
    k_proj_ = register_module("k_proj", linear(c.d_model, n_kv_head_ * hd_, variant.qkv_bias));
    v_proj_ = register_module("v_proj", linear(c.d_model, n_kv_head_ * hd_, variant.qkv_bias));
    o_proj_ = register_module("o_proj", linear(n_head_ * hd_, c.d_model, false));
    if (variant.qk_norm) {
      q_norm_ = register_module("q_norm", RmsNorm(hd_, c.norm_eps));
      k_norm_ = register_module("k_norm", RmsNorm(hd_, c.norm_eps));
    }
  }

  // x [B, T, D] at positions 0..T-1 -> [B, T, D], through the fused grouped-query attention, which rotates q and k
  // and reads the key/value heads from the projection in place.
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope) {
    const int64_t B = x.size(0), T = x.size(1), kv = n_kv_head_ * hd_, D = n_head_ * hd_;
    // One matrix product for q, k and v (their weights side by side).
    auto w = torch::cat({q_proj_->weight, k_proj_->weight, v_proj_->weight}, 0);  // [D + 2 kv, D]
    auto proj = torch::matmul(x, w.t());                                          // [B, T, D + 2 kv]
    if (q_proj_->options.bias()) proj = proj + torch::cat({q_proj_->bias, k_proj_->bias, v_proj_->bias});
    if (window_ > 0 && T > window_) {  // the fused kernel is causal only: masked composite attention
      auto q = RotateHalf(proj.narrow(-1, 0, D).view({B, T, n_head_, hd_}), rope.cos, rope.sin);
      auto k = RotateHalf(proj.narrow(-1, D, kv).view({B, T, n_kv_head_, hd_}), rope.cos, rope.sin);
      auto v = proj.narrow(-1, D + kv, kv).view({B, T, n_kv_head_, hd_});
      KvCache scratch;
      return o_proj_->forward(
          CachedAttention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scratch, 0, window_));
    }
    if (!q_norm_.is_empty()) {  // qwen3: q and k normed per head before the rotation (one copy of the projection)
      auto q = q_norm_->forward(proj.narrow(-1, 0, D).view({B, T, n_head_, hd_}));
      auto k = k_norm_->forward(proj.narrow(-1, D, kv).view({B, T, n_kv_head_, hd_}));
      proj = torch::cat({q.reshape({B, T, D}), k.reshape({B, T, kv}), proj.narrow(-1, D + kv, kv)}, -1);
    }
    return o_proj_->forward(GroupedCausalAttention(proj, n_head_, n_kv_head_, rope.cos, rope.sin));
  }

  // x [B, T_new, D] at positions cache.length..; appends this layer's (rotated) keys and values to the cache.
  torch::Tensor ForwardCached(const torch::Tensor& x, const Rotary& rope, KvCache& cache, size_t layer) {
    const int64_t B = x.size(0), T = x.size(1);
    auto q = q_proj_->forward(x).view({B, T, n_head_, hd_});
    auto k = k_proj_->forward(x).view({B, T, n_kv_head_, hd_});
    if (!q_norm_.is_empty()) {
      q = q_norm_->forward(q);
      k = k_norm_->forward(k);
    }
    q = RotateHalf(q, rope.cos, rope.sin).transpose(1, 2);
    k = RotateHalf(k, rope.cos, rope.sin).transpose(1, 2);
    auto v = v_proj_->forward(x).view({B, T, n_kv_head_, hd_}).transpose(1, 2);
    return o_proj_->forward(CachedAttention(q, k, v, cache, layer, window_));
  }

 private:
  int64_t n_head_, n_kv_head_, hd_, window_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RmsNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  LlamaMlpImpl(int64_t d, int64_t ffn) {
    auto linear = [](int64_t in, int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    gate_proj_ = register_module("gate_proj", linear(d, ffn));
    up_proj_ = register_module("up_proj", linear(d, ffn));
    down_proj_ = register_module("down_proj", linear(ffn, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj_->forward(torch::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
  }

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(LlamaMlp);

// One decoder layer; registration order is Hugging Face's LlamaDecoderLayer's.
class LlamaLayerImpl : public torch::nn::Module {
 public:
  LlamaLayerImpl(const ModelConfig& c, const LlamaVariant& variant) {
    self_attn_ = register_module("self_attn", LlamaAttention(c, variant));
    mlp_ = register_module("mlp", LlamaMlp(c.d_model, c.FfnHidden()));
    input_layernorm_ = register_module("input_layernorm", RmsNorm(c.d_model, c.norm_eps));
    post_attention_layernorm_ = register_module("post_attention_layernorm", RmsNorm(c.d_model, c.norm_eps));
  }
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope) {
    auto h = x + self_attn_->forward(input_layernorm_->forward(x), rope);
    return h + mlp_->forward(post_attention_layernorm_->forward(h));
  }
  torch::Tensor ForwardCached(const torch::Tensor& x, const Rotary& rope, KvCache& cache, size_t layer) {
    auto h = x + self_attn_->ForwardCached(input_layernorm_->forward(x), rope, cache, layer);
    return h + mlp_->forward(post_attention_layernorm_->forward(h));
  }

 private:
  LlamaAttention self_attn_{nullptr};
  LlamaMlp mlp_{nullptr};
  RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
};
TORCH_MODULE(LlamaLayer);

// Hugging Face's LlamaModel: the "model." prefix of the parameter names.
class LlamaBackboneImpl : public torch::nn::Module {
 public:
  LlamaBackboneImpl(const ModelConfig& c, const LlamaVariant& variant) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) layers->push_back(LlamaLayer(c, variant));
    norm = register_module("norm", RmsNorm(c.d_model, c.norm_eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaBackbone);

class LlamaModel : public LanguageModel {
 public:
  LlamaModel(const ModelConfig& config, const LlamaVariant& variant)
      : LanguageModel(config), rope_(ComputeRopeFrequencies(config)) {
    model_ = register_module("model", LlamaBackbone(config, variant));
    if (!config.tie_embeddings) {
      lm_head_ = register_module(
          "lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.d_model, config.vocab_size).bias(false)));
    }
    InitParameters(*this);
  }

  torch::Tensor forward(const torch::Tensor& tokens) override {
    auto x = model_->embed_tokens->forward(tokens);
    const Rotary rope = Rope(0, tokens.size(1), x);
    const bool recompute = RecomputeBlocks();
    for (const std::shared_ptr<torch::nn::Module>& layer : *model_->layers) {
      // rope's tables need no gradient (they are functions of the positions only).
      auto run = [layer, rope](const torch::Tensor& in) { return layer->as<LlamaLayer>()->forward(in, rope); };
      x = recompute ? CheckpointedBlock(*layer, run, x) : run(x);
    }
    return Head(x);
  }

  torch::Tensor ForwardCached(const torch::Tensor& tokens, KvCache& cache) override {
    auto x = model_->embed_tokens->forward(tokens);
    const Rotary rope = Rope(cache.length, tokens.size(1), x);
    for (size_t l = 0; l < model_->layers->size(); ++l) {
      x = (*model_->layers)[l]->as<LlamaLayer>()->ForwardCached(x, rope, cache, l);
    }
    cache.length += tokens.size(1);
    return Head(x);
  }

 private:
  Rotary Rope(int64_t start, int64_t T, const torch::Tensor& like) {
    if (start + T > config_.MaxPositions()) {
      throw std::invalid_argument(std::string(EnumName(config_.arch)) + ": position " + std::to_string(start + T - 1) +
                                  " is past model.max_positions (" + std::to_string(config_.MaxPositions()) + ")");
    }
    // The frequencies on like's device, copied once: a copy from pageable host memory on every forward would wait
    // for the device's queued work (a host sync per step on a GPU).
    if (!rope_on_device_.inv_freq.defined() || rope_on_device_.inv_freq.device() != like.device()) {
      rope_on_device_ = rope_;
      rope_on_device_.inv_freq = rope_.inv_freq.to(like.device());
    }
    auto [cos, sin] = RotaryTables(rope_on_device_, start, T, like);
    return {cos, sin};
  }

  torch::Tensor Head(const torch::Tensor& x) {
    auto h = model_->norm->forward(x);
    return !lm_head_.is_empty() ? lm_head_->forward(h) : torch::matmul(h, model_->embed_tokens->weight.t());
  }

  RopeFrequencies rope_;            // on the CPU
  RopeFrequencies rope_on_device_;  // rope_ on the device of the last forward (Rope)
  LlamaBackbone model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};

}  // namespace

LanguageModelPtr MakeLlamaFamily(const ModelConfig& config, const LlamaVariant& variant) {
  const std::string arch(EnumName(config.arch));
  if (config.n_head <= 0 || config.HeadDim() <= 0 || config.HeadDim() % 2 != 0) {
    throw std::invalid_argument(arch + ": the head size (model.head_dim or d_model / n_head) must be even");
  }
  if (config.n_head % config.KvHeads() != 0) {
    throw std::invalid_argument(arch + ": model.n_head must be a multiple of model.n_kv_head");
  }
  return std::make_shared<LlamaModel>(config, variant);
}

LanguageModelPtr MakeLlama(const ModelConfig& config) { return MakeLlamaFamily(config, LlamaVariant{}); }

}  // namespace diloco
