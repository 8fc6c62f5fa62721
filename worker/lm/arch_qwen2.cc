// model.arch: qwen2 — Hugging Face's Qwen2ForCausalLM (Qwen2, Qwen2.5): the llama decoder (worker/lm/llama_family.h)
// with biases on the query, key and value projections:
//   model.layers.<i>.self_attn.{q,k,v}_proj.bias [n_head x hd], [n_kv_head x hd], [n_kv_head x hd]
// (o_proj has none), a tied or untied head. Qwen2's sliding window (use_sliding_window) is refused at import.
#include "worker/lm/llama_family.h"

namespace diloco {

LanguageModelPtr MakeQwen2(const ModelConfig& config) {
  LlamaVariant variant;
  variant.qkv_bias = true;
  return MakeLlamaFamily(config, variant);
}

}  // namespace diloco
