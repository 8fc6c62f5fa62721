// TransformerLM: the decoder-only language model both the workers (training) and the coordinator (theta_0 and
// evaluation) build from `model:`. Token + learned position embeddings, n_layer pre-LayerNorm blocks of causal
// multi-head self-attention and a GELU MLP (4 x d_model), a final LayerNorm, output head tied to the token
// embedding. Init: N(0, 0.02) weights, zero biases, unit LayerNorm gains.
// Shapes: tokens [B, T] int64 with T <= seq_len -> logits [B, T, vocab_size].
// A module instance is not thread-safe; use one per thread.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace diloco {

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(int64_t d_model, int64_t n_head);
  // x: [B, T, d_model]; attention is causal (worker/lm/causal_attention.h).
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t n_head_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_out_{nullptr}, fc_{nullptr}, mlp_out_{nullptr};
};
TORCH_MODULE(TransformerBlock);

class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross-entropy (nats per token) of predicting targets [B, T] from tokens [B, T].
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);

 private:
  ModelConfig config_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(TransformerLM);

// Builds the model with torch's global RNG seeded by `seed` (so theta_0 is a function of model: and run.seed).
TransformerLM MakeTransformerLM(const ModelConfig& config, int64_t seed);

// The model's parameters by name, in registration order: the order of the fingerprint and of every tensor stream.
std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(const torch::nn::Module& model);

// Copies `values` (same names and shapes) into the model's parameters.
void LoadParameters(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& values);

}  // namespace diloco
