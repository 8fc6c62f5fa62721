// model.arch: gpt — our original model, unchanged (its parameter names, order and init give the same fingerprint and
// theta_0 as before architectures existed). Token + learned position embeddings (seq_len rows), n_layer pre-LayerNorm
// blocks of causal multi-head self-attention (fused q/k/v projection, worker/lm/causal_attention.h) and an exact-erf
// GELU MLP (4 x d_model), a final LayerNorm (eps 1e-5), output head tied to the token embedding.
// This is GPT-2's layout with the exact GELU and nn.Linear's [out, in] weights. With model.activation_checkpointing,
// training recomputes each block in backward (worker/lm/checkpointed.h).
#include <stdexcept>

#include "worker/lm/causal_attention.h"
#include "worker/lm/checkpointed.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(int64_t d_model, int64_t n_head) : n_head_(n_head) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    qkv_ = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    attn_out_ = register_module("attn_out", torch::nn::Linear(d_model, d_model));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    fc_ = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
    mlp_out_ = register_module("mlp_out", torch::nn::Linear(4 * d_model, d_model));
  }

  // x: [B, T, d_model].
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attn_out_->forward(CausalSelfAttention(qkv_->forward(ln1_->forward(x)), n_head_));
    return h + Mlp(h);
  }

  // x: [B, T_new, d_model] at positions cache.length..; appends this layer's keys/values to cache slot `layer`.
  torch::Tensor ForwardCached(const torch::Tensor& x, KvCache& cache, size_t layer) {
    auto h = x + attn_out_->forward(CachedAttention(qkv_->forward(ln1_->forward(x)), n_head_, cache, layer));
    return h + Mlp(h);
  }

 private:
  torch::Tensor Mlp(const torch::Tensor& h) { return mlp_out_->forward(torch::gelu(fc_->forward(ln2_->forward(h)))); }

  int64_t n_head_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_out_{nullptr}, fc_{nullptr}, mlp_out_{nullptr};
};
TORCH_MODULE(GptBlock);

class GptModel : public LanguageModel {
 public:
  explicit GptModel(const ModelConfig& config) : LanguageModel(config) {
    tok_emb_ = register_module("tok_emb", torch::nn::Embedding(config.vocab_size, config.d_model));
    pos_emb_ = register_module("pos_emb", torch::nn::Embedding(config.seq_len, config.d_model));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < config.n_layer; ++i) blocks_->push_back(GptBlock(config.d_model, config.n_head));
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.d_model})));
    InitParameters(*this);
  }

  torch::Tensor forward(const torch::Tensor& tokens) override {
    auto x = Embed(tokens, 0);
    const bool recompute = RecomputeBlocks();
    for (const std::shared_ptr<torch::nn::Module>& block : *blocks_) {
      auto run = [block](const torch::Tensor& in) { return block->as<GptBlock>()->forward(in); };
      x = recompute ? CheckpointedBlock(*block, run, x) : run(x);
    }
    return Head(x);
  }

  torch::Tensor ForwardCached(const torch::Tensor& tokens, KvCache& cache) override {
    auto x = Embed(tokens, cache.length);
    for (size_t l = 0; l < blocks_->size(); ++l) x = (*blocks_)[l]->as<GptBlock>()->ForwardCached(x, cache, l);
    cache.length += tokens.size(1);
    return Head(x);
  }

 private:
  torch::Tensor Embed(const torch::Tensor& tokens, int64_t start) {
    const int64_t T = tokens.size(1);
    if (start + T > config_.seq_len) throw std::invalid_argument("sequence longer than model.seq_len");
    auto positions =
        torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    return tok_emb_->forward(tokens) + pos_emb_->forward(positions);
  }
  torch::Tensor Head(const torch::Tensor& x) { return torch::matmul(ln_f_->forward(x), tok_emb_->weight.t()); }

  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};

}  // namespace

LanguageModelPtr MakeGpt(const ModelConfig& config) { return std::make_shared<GptModel>(config); }

}  // namespace diloco
