// LanguageModel: the one interface every architecture of `model.arch` implements (gpt: ours; gpt2: Hugging Face's
// GPT2LMHeadModel; llama: LlamaForCausalLM; mistral, qwen2, qwen3: theirs, from llama's code), and what the trainer,
// the coordinator's evaluation, the export and generation use. An architecture is one file (worker/lm/arch_<name>.cc)
// plus one line in worker/lm/model_registry.cc. Everything else works from the generic named-parameter list: the
// fingerprint (names, shapes, dtypes in registration order), the wire's chunk streams, Streaming DiLoCo's fragments
// (the first integer component of a name is its layer index: "blocks.3.ln1.weight",
// "model.layers.3.mlp.up_proj.weight", "transformer.h.3.attn.c_attn.bias"), checkpoints and the export. gpt2 and the
// llama-shaped archs register their parameters under Hugging Face's own names and layouts, so their state dict is a
// Hugging Face checkpoint's (less a tied lm_head). Shapes: tokens [B, T] int64, T <= the model's context -> logits [B,
// T, vocab_size]. A module instance is not thread-safe; use one per thread.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "proto/named_tensors.h"
#include "worker/lm/kv_cache.h"

namespace diloco {

class LanguageModel : public torch::nn::Module {
 public:
  explicit LanguageModel(ModelConfig config) : config_(std::move(config)) {}

  // Logits [B, T, vocab_size] of tokens [B, T] (causal; positions 0..T-1).
  virtual torch::Tensor forward(const torch::Tensor& tokens) = 0;

  // Logits [B, T_new, vocab_size] of tokens [B, T_new] at positions cache.length .. cache.length + T_new - 1, given
  // the cached keys/values of the earlier positions; appends the new ones to `cache`. Call under NoGradGuard. The
  // result equals forward() over the whole sequence at those positions (to float rounding), at O(context) per token.
  virtual torch::Tensor ForwardCached(const torch::Tensor& tokens, KvCache& cache) = 0;

  // Mean cross-entropy (nats per token) of predicting targets [B, T] from tokens [B, T].
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  const ModelConfig& config() const { return config_; }

 protected:
  // Whether forward() runs its blocks through CheckpointedBlock (worker/lm/checkpointed.h): model.
  // activation_checkpointing while training (train() mode and grad mode on); never for eval, generation or the cache.
  bool RecomputeBlocks() const {
    return config_.activation_checkpointing && is_training() && torch::GradMode::is_enabled();
  }

  ModelConfig config_;
};

using LanguageModelPtr = std::shared_ptr<LanguageModel>;

// The model `config.arch` names, with torch's global RNG seeded by `seed` (theta_0 is a function of model: and
// run.seed). Throws std::invalid_argument for an architecture without a registry entry.
LanguageModelPtr MakeLanguageModel(const ModelConfig& config, int64_t seed);

// The model's parameters by name, in registration order: the order of the fingerprint and of every tensor stream.
NamedTensors NamedParameters(const torch::nn::Module& model);

// Copies `values` (same names and shapes) into the model's parameters.
void LoadParameters(torch::nn::Module& model, const NamedTensors& values);

// Every architecture's init: N(0, 0.02) for matrices and embeddings, zero biases, unit norm gains (a parameter whose
// name contains "ln" or "norm" and ends in "weight"). Hugging Face's initializer_range is 0.02 too.
void InitParameters(torch::nn::Module& model);

}  // namespace diloco
