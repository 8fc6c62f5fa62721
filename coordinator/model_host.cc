#include "coordinator/model_host.h"

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/tensor_spec.h"
#include "worker/lm/device_choice.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/init_from.h"
#include "worker/lm/language_model.h"
#include "worker/lm/token_data.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

// Holds a model instance and the validation split; evaluates a theta.
class ModelEvaluator : public Evaluator {
 public:
  ModelEvaluator(LanguageModelPtr model, TokenData val, int64_t batches, int64_t batch_size, torch::Device device)
      : model_(std::move(model)), val_(std::move(val)), batches_(batches), batch_size_(batch_size), device_(device) {
    model_->to(device_);
  }
  double Evaluate(const NamedTensors& theta) override {
    LoadParameters(*model_, theta);  // theta stays on the CPU; copied into the model on its device
    return EvaluateLoss(model_, val_, batches_, batch_size_, device_);
  }

 private:
  LanguageModelPtr model_;
  TokenData val_;
  int64_t batches_, batch_size_;
  torch::Device device_;
};

}  // namespace

absl::StatusOr<HostedModel> HostModel(const Config& config, const TokenCache& cache) {
  const bool cuda_built = torch_compat::CudaBuilt();
  auto device = ChooseDevice(config.coordinator.device, "coordinator.device", 0, 1,
                             CudaFacts{cuda_built, cuda_built ? static_cast<int>(torch::cuda::device_count()) : 0});
  if (!device.ok()) return device.status();
  HostedModel hosted;
  LanguageModelPtr model = MakeLanguageModel(config.model, config.run.seed);
  if (!config.model.init_from.empty()) {
    std::string source;
    absl::Status s = LoadInitFrom(config.model, *model, &source);
    if (!s.ok()) return s;
    spdlog::info("theta_0 from {}", source);
  }
  for (const auto& [name, p] : NamedParameters(*model)) hosted.theta_0.emplace_back(name, p.detach().clone());
  auto val = TokenData::Load(cache.meta_path(), TokenSplit::kVal, config.model.seq_len);
  if (!val.ok()) return val.status();
  hosted.evaluator =
      std::make_unique<ModelEvaluator>(std::move(model), std::move(*val), config.coordinator.eval_batches,
                                       config.inner.batch_size, torch::Device(device->device));
  return hosted;
}

}  // namespace diloco
