// theta_0 from model.init_from (the paper's pretrained start), one function for the coordinator
// (coordinator/model_host.cc) and the data-parallel baseline (worker/data_parallel.cc). init_from is either
//   - our checkpoint file (proto/checkpoint.h, which lives in proto/ so that worker/ can read it): its parameters,
//     which must carry the model's fingerprint; or
//   - a Hugging Face model directory: config.json (already merged into model: by the config loader,
//     config/hf_model_config.h) plus model.safetensors or model.safetensors.index.json and its shards, read by
//     LoadHfWeights and copied by name by CopyHfWeights (worker/lm/hf_weights.h): fp32, bf16 or fp16 weights become
//     float32; a missing tensor or another shape is an error.
// Errors are one line naming model.init_from and the path (and the tensor). Stateless; thread-safe for distinct
// models.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "config/config.h"
#include "worker/lm/language_model.h"

namespace diloco {

// Writes init_from's values into `model`'s parameters (model was built from `config`); *source, when given,
// describes what was loaded for the start-up log. On error the model may be partly written.
absl::Status LoadInitFrom(const ModelConfig& config, LanguageModel& model, std::string* source = nullptr);

}  // namespace diloco
