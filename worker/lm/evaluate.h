// Validation loss of a model: mean cross-entropy (nats per token) over the fixed evaluation batches of a split
// (TokenData::EvalBatch). Deterministic for a given model, split and batch settings. Uses the caller's model
// (not thread-safe with respect to it); switches it to eval mode and back.
#pragma once

#include "worker/data/token_data.h"
#include "worker/lm/language_model.h"

namespace diloco {

double EvaluateLoss(LanguageModelPtr& model, const TokenData& data, int64_t num_batches, int64_t batch_size,
                    const torch::Device& device = torch::kCPU);

}  // namespace diloco
