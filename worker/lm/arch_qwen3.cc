// model.arch: qwen3 — Hugging Face's Qwen3ForCausalLM: the llama decoder (worker/lm/llama_family.h) with an RMSNorm
// over each head of the queries and keys before the rotary embedding,
//   model.layers.<i>.self_attn.{q,k}_norm.weight [hd]   (eps: model.norm_eps, in float32 like every RMSNorm)
// and usually an explicit head_dim (model.head_dim, e.g. 128 with d_model 1024 and 16 heads). No attention biases.
#include "worker/lm/llama_family.h"

namespace diloco {

LanguageModelPtr MakeQwen3(const ModelConfig& config) {
  LlamaVariant variant;
  variant.qk_norm = true;
  return MakeLlamaFamily(config, variant);
}

}  // namespace diloco
