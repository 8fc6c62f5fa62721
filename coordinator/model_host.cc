#include "coordinator/model_host.h"

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <stdexcept>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "proto/tensor_spec.h"
#include "worker/data/token_data.h"
#include "worker/lm/device_choice.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/init_from.h"
#include "worker/lm/language_model.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

// Points every parameter of `model` at the tensor of the same name in `theta` (no copy), or, with an empty `theta`,
// at an empty tensor (so the model holds no parameter memory).
void AliasParameters(torch::nn::Module& model, const NamedTensors& theta) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters(true);
  if (theta.empty()) {
    for (auto& p : params) p.value().set_data(at::empty({0}, p.value().options()));
    return;
  }
  if (params.size() != theta.size()) throw std::invalid_argument("evaluator: tensor count differs from the model's");
  for (const auto& [name, value] : theta) {
    torch::Tensor* p = params.find(name);
    if (p == nullptr) throw std::invalid_argument("evaluator: the model has no parameter '" + name + "'");
    p->set_data(value);  // theta has theta_0's layout, i.e. this model's (the core refuses another fingerprint)
  }
}

// Holds a model instance (without parameter memory of its own on the CPU) and the validation split; evaluates a
// theta. On the CPU the model's parameters are theta's own tensors for the duration of Evaluate (the core's round
// thread, where nothing writes theta), so evaluation costs no copy of the model; on a GPU theta is copied there.
class ModelEvaluator : public Evaluator {
 public:
  ModelEvaluator(LanguageModelPtr model, TokenData val, int64_t batches, int64_t batch_size, torch::Device device)
      : model_(std::move(model)), val_(std::move(val)), batches_(batches), batch_size_(batch_size), device_(device) {
    if (device_.is_cpu()) {
      AliasParameters(*model_, {});
    } else {
      model_->to(device_);
    }
  }
  double Evaluate(const NamedTensors& theta) override {
    if (!device_.is_cpu()) {
      LoadParameters(*model_, theta);  // copied into the model on its device
      return EvaluateLoss(model_, val_, batches_, batch_size_, device_);
    }
    AliasParameters(*model_, theta);
    absl::Cleanup release = [this] { AliasParameters(*model_, {}); };  // keeps no reference to theta, even on a throw
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
  // theta_0 takes the model's parameter memory (no copy); the evaluator's model then holds none (ModelEvaluator).
  for (const auto& [name, p] : NamedParameters(*model)) hosted.theta_0.emplace_back(name, p.detach());
  auto val = TokenData::Load(cache.meta_path(), TokenSplit::kVal, config.model.seq_len);
  if (!val.ok()) return val.status();
  hosted.evaluator =
      std::make_unique<ModelEvaluator>(std::move(model), std::move(*val), config.coordinator.eval_batches,
                                       config.inner.batch_size, torch::Device(device->device));
  return hosted;
}

}  // namespace diloco
