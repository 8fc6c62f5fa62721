// Validation loss of a model: mean cross-entropy (nats per token) over the fixed evaluation batches of a split
// (TokenData::EvalBatch). Deterministic for a given model, split and batch settings. Uses the caller's model
// (not thread-safe with respect to it); switches it to eval mode and back.
// EvalReplica: a model of its own on a given device (the rank's GPU in --mode ddp, worker/data_parallel.cc) into which
// a trained model's parameters are copied device to device before each evaluation, so the evaluation runs where the
// training runs and leaves the trained model untouched. Owns its model; not thread-safe.
#pragma once

#include "worker/data/token_data.h"
#include "worker/lm/language_model.h"

namespace diloco {

double EvaluateLoss(LanguageModelPtr& model, const TokenData& data, int64_t num_batches, int64_t batch_size,
                    const torch::Device& device = torch::kCPU);

class EvalReplica {
 public:
  // A model of `config` (initialised from `seed`; overwritten by every Evaluate) placed on `device`.
  EvalReplica(const ModelConfig& config, int64_t seed, const torch::Device& device);
  // Copies `trained`'s parameters (same architecture, any device) into the replica and returns EvaluateLoss on the
  // replica's device.
  double Evaluate(const torch::nn::Module& trained, const TokenData& data, int64_t num_batches, int64_t batch_size);
  const LanguageModelPtr& model() const { return model_; }
  const torch::Device& device() const { return device_; }

 private:
  LanguageModelPtr model_;
  torch::Device device_;
};

}  // namespace diloco
