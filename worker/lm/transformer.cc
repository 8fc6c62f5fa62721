#include "worker/lm/transformer.h"

#include <stdexcept>

#include "worker/lm/causal_attention.h"

namespace diloco {

TransformerBlockImpl::TransformerBlockImpl(int64_t d_model, int64_t n_head) : n_head_(n_head) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  qkv_ = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
  attn_out_ = register_module("attn_out", torch::nn::Linear(d_model, d_model));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  fc_ = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
  mlp_out_ = register_module("mlp_out", torch::nn::Linear(4 * d_model, d_model));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn_out_->forward(CausalSelfAttention(qkv_->forward(ln1_->forward(x)), n_head_));
  return h + mlp_out_->forward(torch::gelu(fc_->forward(ln2_->forward(h))));
}

TransformerLMImpl::TransformerLMImpl(const ModelConfig& config) : config_(config) {
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(config.vocab_size, config.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(config.seq_len, config.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) blocks_->push_back(TransformerBlock(config.d_model, config.n_head));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.d_model})));

  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.find("ln") != std::string::npos) continue;  // LayerNorm: weight 1, bias 0 (their defaults)
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.value().zero_();
    } else {
      p.value().normal_(0.0, 0.02);
    }
  }
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > config_.seq_len) throw std::invalid_argument("sequence longer than model.seq_len");
  auto positions = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto x = tok_emb_->forward(tokens) + pos_emb_->forward(positions);
  for (const auto& block : *blocks_) x = block->as<TransformerBlock>()->forward(x);
  return torch::matmul(ln_f_->forward(x), tok_emb_->weight.t());  // tied head: [B, T, V]
}

torch::Tensor TransformerLMImpl::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

TransformerLM MakeTransformerLM(const ModelConfig& config, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  return TransformerLM(config);
}

std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  return out;
}

void LoadParameters(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& values) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters(true);
  if (params.size() != values.size()) throw std::invalid_argument("LoadParameters: tensor count differs");
  for (const auto& [name, value] : values) {
    torch::Tensor* p = params.find(name);
    if (p == nullptr) throw std::invalid_argument("LoadParameters: no parameter '" + name + "'");
    p->copy_(value);
  }
}

}  // namespace diloco
