// Model host: the one coordinator file that knows the model (worker/lm/). It builds what the model-free core
// (coordinator.h) is created from: theta_0 as plain float32 tensors by name (random init from model: and run.seed, or
// model.init_from: our checkpoint of the same model or a Hugging Face directory, worker/lm/init_from.h), and the
// Evaluator that computes the validation loss of a theta over the validation token shard of the token cache
// (coordinator.eval_batches batches of inner.batch_size sequences). HostModel is a stateless factory (thread-safe); the
// Evaluator it returns owns a model instance and the validation data and is called from one thread at a time (the
// core's round thread).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "coordinator/evaluator.h"

namespace diloco {

struct HostedModel {
  NamedTensors theta_0;
  std::unique_ptr<Evaluator> evaluator;
};

// Errors name the key to fix: model.init_from (unreadable, or a checkpoint of another model) or the validation shard.
absl::StatusOr<HostedModel> HostModel(const Config& config, const TokenCache& cache);

}  // namespace diloco
