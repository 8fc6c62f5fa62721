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

}  // namespace diloco
