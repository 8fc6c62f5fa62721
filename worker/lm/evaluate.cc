#include "worker/lm/evaluate.h"

namespace diloco {

double EvaluateLoss(LanguageModelPtr& model, const TokenData& data, int64_t num_batches, int64_t batch_size,
                    const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  double total = 0;
  for (int64_t i = 0; i < num_batches; ++i) {
    Batch b = data.EvalBatch(i, num_batches, batch_size);
    total += model->Loss(b.inputs.to(device), b.targets.to(device)).item<double>();
  }
  model->train(was_training);
  return total / static_cast<double>(num_batches);
}

EvalReplica::EvalReplica(const ModelConfig& config, int64_t seed, const torch::Device& device)
    : model_(MakeLanguageModel(config, seed)), device_(device) {
  model_->to(device_);
}

double EvalReplica::Evaluate(const torch::nn::Module& trained, const TokenData& data, int64_t num_batches,
                             int64_t batch_size) {
  LoadParameters(*model_, NamedParameters(trained));  // copy_: device to device, no trip through the host
  return EvaluateLoss(model_, data, num_batches, batch_size, device_);
}

}  // namespace diloco
