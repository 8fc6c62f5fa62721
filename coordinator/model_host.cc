#include "coordinator/model_host.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/tensor_spec.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/init_from.h"
#include "worker/lm/language_model.h"
#include "worker/lm/token_data.h"

namespace diloco {
namespace {

// Holds a model instance and the validation split; evaluates a theta.
class ModelEvaluator : public Evaluator {
 public:
  ModelEvaluator(LanguageModelPtr model, TokenData val, int64_t batches, int64_t batch_size)
      : model_(std::move(model)), val_(std::move(val)), batches_(batches), batch_size_(batch_size) {}
  double Evaluate(const NamedTensors& theta) override {
    LoadParameters(*model_, theta);
    return EvaluateLoss(model_, val_, batches_, batch_size_);
  }

 private:
  LanguageModelPtr model_;
  TokenData val_;
  int64_t batches_, batch_size_;
};

}  // namespace

absl::StatusOr<HostedModel> HostModel(const Config& config, const TokenCache& cache) {
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
  hosted.evaluator = std::make_unique<ModelEvaluator>(std::move(model), std::move(*val),
                                                      config.coordinator.eval_batches, config.inner.batch_size);
  return hosted;
}

}  // namespace diloco
