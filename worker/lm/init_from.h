// theta_0 from model.init_from (the paper's pretrained start), one function for the coordinator
// (coordinator/model_host.cc) and the data-parallel baseline (worker/data_parallel.cc). init_from is either
//   - our checkpoint file (proto/checkpoint.h): its parameters, which must carry the model's fingerprint; or
//   - a Hugging Face model directory (config.json + model.safetensors or model.safetensors.index.json and shards,
//     read by LoadHfWeights, worker/lm/hf_weights.h): every parameter of the model is copied by name from the stored
//     tensor of the same name and shape, converted from fp32/bf16/fp16 to float32. Stored tensors the model lacks
//     (a tied lm_head.weight, GPT-2's attn.bias masks) are ignored. The config loader has already taken the model
//     keys from config.json (config/hf_model_config.h), so the shapes agree unless the weights disagree with it.
// Errors are one line naming model.init_from, the path and the tensor. Stateless; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"

namespace diloco {

// theta_0: the model's parameters by name (float32, in registration order), replaced in place (same names, shapes
// and order) by init_from's values. Returns a description of the source for the start-up log in *source.
absl::Status LoadInitFrom(const ModelConfig& model, std::vector<std::pair<std::string, at::Tensor>>& theta_0,
                          std::string* source = nullptr);

// The Hugging Face half: theta_0's tensors replaced by `stored`'s of the same name (fp32, bf16 or fp16; converted to
// float32). NotFound for a missing tensor, FailedPrecondition for a shape that differs; `dir` names the source.
absl::Status CopyHfWeights(const std::string& dir, const std::unordered_map<std::string, at::Tensor>& stored,
                           std::vector<std::pair<std::string, at::Tensor>>& theta_0);

}  // namespace diloco
