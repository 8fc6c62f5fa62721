// The model: section's cross-key rules, per architecture (worker/lm/language_model.h): head counts, MLP width,
// positions, token ids. Called by ValidateConfig (config_loader.h). Pure; thread-safe.
#pragma once

#include "absl/status/status.h"
#include "config/config.h"

namespace diloco {

// InvalidArgument naming the model key(s) at fault.
absl::Status ValidateModel(const ModelConfig& m);

}  // namespace diloco
