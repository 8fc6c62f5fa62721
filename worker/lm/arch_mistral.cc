// model.arch: mistral — Hugging Face's MistralForCausalLM: the llama decoder (worker/lm/llama_family.h) under
// model_type "mistral", with an explicit head_dim and sliding-window attention: with model.sliding_window W > 0 the
// query at position p attends to the keys at p - W + 1 .. p (transformers' sliding_window_causal mask), in training,
// eval and generation with the cache. Parameter names and shapes are llama's.
#include "worker/lm/llama_family.h"

namespace diloco {

LanguageModelPtr MakeMistral(const ModelConfig& config) { return MakeLlamaFamily(config, LlamaVariant{}); }

}  // namespace diloco
