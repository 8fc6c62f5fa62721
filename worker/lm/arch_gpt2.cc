// model.arch: gpt2 — exactly Hugging Face's GPT2LMHeadModel (transformers' modeling_gpt2.py), with its parameter names
// and layouts, so that this module's state dict is the Hugging Face checkpoint's (less the tied lm_head):
//   transformer.wte.weight [vocab, D], transformer.wpe.weight [max_positions, D]
//   transformer.h.<i>.ln_1.{weight,bias} [D], attn.c_attn.weight [D, 3D] + bias [3D], attn.c_proj.weight [D, D] + bias,
//   ln_2.{weight,bias}, mlp.c_fc.weight [D, F] + bias [F], mlp.c_proj.weight [F, D] + bias [D]   (F = FfnHidden())
//   transformer.ln_f.{weight,bias} [D]
// Hugging Face's Conv1D stores weights as [in, out]: y = x @ W + b (not nn.Linear's [out, in]); kept so that names and
// shapes equal Hugging Face's. Per block: h = x + c_proj(Attention(c_attn(ln_1(x)))), out = h + mlp(ln_2(h)) with
// mlp = c_proj(gelu_new(c_fc)), gelu_new being GELU's tanh approximation; LayerNorm eps = model.norm_eps; the output
// head is tied to wte. c_attn's output is q|k|v with heads contiguous: the fused causal attention's layout. With
// model.activation_checkpointing, training recomputes each block in backward (worker/lm/checkpointed.h).
#include <stdexcept>
#include <string>

#include "worker/lm/causal_attention.h"
#include "worker/lm/checkpointed.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

// Hugging Face's Conv1D: weight [in, out], bias [out]; y = x @ weight + bias.
class Conv1DImpl : public torch::nn::Module {
 public:
  Conv1DImpl(int64_t in, int64_t out) {
    weight_ = register_parameter("weight", torch::empty({in, out}));
    bias_ = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto sizes = x.sizes().vec();
    sizes.back() = weight_.size(1);
    return torch::addmm(bias_, x.reshape({-1, x.size(-1)}), weight_).view(sizes);
  }

 private:
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(Conv1D);

torch::nn::LayerNorm MakeLayerNorm(int64_t d, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(eps));
}

class Gpt2AttentionImpl : public torch::nn::Module {
 public:
  explicit Gpt2AttentionImpl(const ModelConfig& c) : n_head_(c.n_head) {
    c_attn_ = register_module("c_attn", Conv1D(c.d_model, 3 * c.d_model));
    c_proj_ = register_module("c_proj", Conv1D(c.d_model, c.d_model));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return c_proj_->forward(CausalSelfAttention(c_attn_->forward(x), n_head_));
  }
  torch::Tensor ForwardCached(const torch::Tensor& x, KvCache& cache, size_t layer) {
    return c_proj_->forward(CachedAttention(c_attn_->forward(x), n_head_, cache, layer));
  }

 private:
  int64_t n_head_;
  Conv1D c_attn_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(Gpt2Attention);

class Gpt2MlpImpl : public torch::nn::Module {
 public:
  Gpt2MlpImpl(int64_t d, int64_t ffn) {
    c_fc_ = register_module("c_fc", Conv1D(d, ffn));
    c_proj_ = register_module("c_proj", Conv1D(ffn, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj_->forward(torch::gelu(c_fc_->forward(x), "tanh")); }

 private:
  Conv1D c_fc_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

// One block; registration order is Hugging Face's GPT2Block's.
class Gpt2BlockImpl : public torch::nn::Module {
 public:
  explicit Gpt2BlockImpl(const ModelConfig& c) {
    ln_1_ = register_module("ln_1", MakeLayerNorm(c.d_model, c.norm_eps));
    attn_ = register_module("attn", Gpt2Attention(c));
    ln_2_ = register_module("ln_2", MakeLayerNorm(c.d_model, c.norm_eps));
    mlp_ = register_module("mlp", Gpt2Mlp(c.d_model, c.FfnHidden()));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attn_->forward(ln_1_->forward(x));
    return h + mlp_->forward(ln_2_->forward(h));
  }
  torch::Tensor ForwardCached(const torch::Tensor& x, KvCache& cache, size_t layer) {
    auto h = x + attn_->ForwardCached(ln_1_->forward(x), cache, layer);
    return h + mlp_->forward(ln_2_->forward(h));
  }

 private:
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Gpt2Attention attn_{nullptr};
  Gpt2Mlp mlp_{nullptr};
};
TORCH_MODULE(Gpt2Block);

// Hugging Face's GPT2Model: the "transformer." prefix of the parameter names.
class Gpt2BackboneImpl : public torch::nn::Module {
 public:
  explicit Gpt2BackboneImpl(const ModelConfig& c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(c.MaxPositions(), c.d_model));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Gpt2Block(c));
    ln_f = register_module("ln_f", MakeLayerNorm(c.d_model, c.norm_eps));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt2Backbone);

class Gpt2Model : public LanguageModel {
 public:
  explicit Gpt2Model(const ModelConfig& config) : LanguageModel(config) {
    if (config.n_head <= 0 || config.d_model % config.n_head != 0) {
      throw std::invalid_argument("gpt2: model.d_model must be a multiple of model.n_head");
    }
    transformer_ = register_module("transformer", Gpt2Backbone(config));
    InitParameters(*this);
  }

  torch::Tensor forward(const torch::Tensor& tokens) override {
    auto x = Embed(tokens, 0);
    const bool recompute = RecomputeBlocks();
    for (const std::shared_ptr<torch::nn::Module>& block : *transformer_->h) {
      auto run = [block](const torch::Tensor& in) { return block->as<Gpt2Block>()->forward(in); };
      x = recompute ? CheckpointedBlock(*block, run, x) : run(x);
    }
    return Head(x);
  }

  torch::Tensor ForwardCached(const torch::Tensor& tokens, KvCache& cache) override {
    auto x = Embed(tokens, cache.length);
    for (size_t l = 0; l < transformer_->h->size(); ++l) {
      x = (*transformer_->h)[l]->as<Gpt2Block>()->ForwardCached(x, cache, l);
    }
    cache.length += tokens.size(1);
    return Head(x);
  }

 private:
  torch::Tensor Embed(const torch::Tensor& tokens, int64_t start) {
    const int64_t T = tokens.size(1);
    if (start + T > config_.MaxPositions()) {
      throw std::invalid_argument("gpt2: position " + std::to_string(start + T - 1) + " is past model.max_positions (" +
                                  std::to_string(config_.MaxPositions()) + ")");
    }
    auto positions =
        torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    return transformer_->wte->forward(tokens) + transformer_->wpe->forward(positions);
  }
  torch::Tensor Head(const torch::Tensor& x) {
    return torch::matmul(transformer_->ln_f->forward(x), transformer_->wte->weight.t());
  }

  Gpt2Backbone transformer_{nullptr};
};

}  // namespace

LanguageModelPtr MakeGpt2(const ModelConfig& config) { return std::make_shared<Gpt2Model>(config); }

}  // namespace diloco
