// Hugging Face model directories' weights: LoadHfWeights reads `model.safetensors`, or the shards that
// `model.safetensors.index.json` lists in its weight_map, into one name -> float32 tensor map (F32, BF16 and F16
// files; worker/lm/safetensors.h). CopyHfWeights puts such a map into a LanguageModel by name: gpt2 and llama register
// their parameters under Hugging Face's own names and shapes (worker/lm/arch_gpt2.cc, arch_llama.cc), so the map and
// the state dict match one to one. config.json is not read here (config/ maps it to a ModelConfig).
// Stateless functions; thread-safe for distinct models.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/lm/language_model.h"

namespace diloco {

using HfWeights = std::map<std::string, torch::Tensor>;

// The weights of the Hugging Face model directory `dir`. NotFound when it has neither model.safetensors nor
// model.safetensors.index.json; a shard's error names its file; InvalidArgument for a tensor stored twice or a
// weight_map entry missing from its shard.
absl::StatusOr<HfWeights> LoadHfWeights(const std::string& dir);

// Copies `weights` (read from `dir`, named in errors) into `model`'s parameters. Every parameter must be present with
// its shape; `lm_head.weight` is accepted and ignored when the model's head is tied; rotary `inv_freq` buffers and
// GPT-2's attention-mask buffers (`.attn.bias`, `.attn.masked_bias`) are ignored; any other tensor is an error naming
// it. A checkpoint of the base model (names without the "model." / "transformer." prefix, as the original GPT-2
// files have) is accepted too. On error the model may be partly written.
absl::Status CopyHfWeights(const HfWeights& weights, const std::string& dir, LanguageModel& model);

}  // namespace diloco
