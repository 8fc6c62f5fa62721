// Hugging Face `config.json` <-> our model: keys. Reads the config.json of a Hugging Face model directory
// (model.init_from) into ModelConfig values plus the list of model keys it determines, and writes a config.json and a
// generation_config.json for a ModelConfig (diloco-ctl export --format hf). One small table per architecture:
//   the llama-shaped families llama (LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM) and
//   qwen3 (Qwen3ForCausalLM), one row each of defaults, and gpt2 (model_type "gpt2", GPT2LMHeadModel); our arch gpt
//   is written as a GPT2LMHeadModel with activation_function "gelu" (exact erf, what gpt computes), never read back.
// Both layouts transformers writes are read: 4.x (top-level rope_theta, rope_scaling, torch_dtype) and 5.x
// (rope_parameters {rope_theta, rope_type, ...}, dtype); rope types default, linear, llama3, yarn and dynamic with
// their keys (worker/lm/rope.h), any other refused naming it; head_dim; mistral's sliding_window (a qwen2 / qwen3
// sliding_attention layer, as transformers lays them out, is refused). A key
// absent from config.json takes transformers' default for that class (LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config, GPT2Config in transformers 5.25). The export writes both layouts' rope keys. Token ids outside the
// vocabulary (GPT2Config's default 50256 on a small vocabulary) are read as -1 (none), as transformers only warns about
// them. Pure functions over nlohmann-json; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace diloco {

struct HfModelConfig {
  ModelConfig model;              // the keys config.json determines; every other field keeps its default
  std::vector<std::string> keys;  // those keys, "model.<name>" (model.arch first), in schema order
  std::string dtype;              // informational: the stored weights' dtype ("float32", "bfloat16", ...; "" unknown)
  // Training settings config.json asks for that this trainer does not apply, "key value" each: a non-zero dropout
  // (attention_dropout; GPT-2's attn_pdrop, embd_pdrop, resid_pdrop). Training runs without dropout; the loader says
  // so in its theta_0 line (worker/lm/init_from.h) rather than refusing GPT-2's 0.1 defaults.
  std::vector<std::string> not_applied;
};

// `origin` names the file in error messages (e.g. "<dir>/config.json"). Errors: unknown model_type (naming the
// supported ones), a feature we do not implement (another rope type, biases, another activation), a wrong type.
absl::StatusOr<HfModelConfig> ParseHfModelConfig(const nlohmann::json& config_json, const std::string& origin);

// Reads <dir>/config.json. NotFound (naming the path) when the file is missing.
absl::StatusOr<HfModelConfig> ReadHfModelConfig(const std::string& dir);

// True when `path` is a directory holding a config.json (a Hugging Face model directory).
bool IsHfModelDir(const std::string& path);

// The ids at which transformers' generate() stops for the Hugging Face model directory `dir`: generation_config.json's
// eos_token_id (an id or a list: Llama 3.1 / 3.2 Instruct list <|end_of_text|>, <|eom_id|> and <|eot_id|>,
// Qwen2.5-Instruct <|im_end|> and <|endoftext|>) when that file exists, even when it names none (transformers 5.25
// then reads nothing of config.json's); else config.json's. Each below vocab_size, in the file's order. Empty when
// `dir` is not such a directory or names none. model.eos_token_id keeps config.json's first (the EOS written between
// documents).
std::vector<int64_t> HfStopTokenIds(const std::string& dir, int64_t vocab_size);

// config.json for `model` with weights stored as `dtype` ("float32" or "bfloat16"). `transformers_version` is
// what the file claims to have been written for (transformers checks it only for warnings). `eos_ids`: with more
// than one id (HfStopTokenIds of the directory the model came from), eos_token_id is written as that list.
nlohmann::ordered_json HfConfigJson(const ModelConfig& model, const std::string& dtype,
                                    const std::string& transformers_version = "4.46.0",
                                    const std::vector<int64_t>& eos_ids = {});

// generation_config.json: bos/eos ids (omitted when -1; eos_ids as for HfConfigJson).
nlohmann::ordered_json HfGenerationConfigJson(const ModelConfig& model,
                                              const std::string& transformers_version = "4.46.0",
                                              const std::vector<int64_t>& eos_ids = {});

}  // namespace diloco
