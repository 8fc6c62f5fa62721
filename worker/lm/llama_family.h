// The llama-shaped decoder of model.arch llama, mistral, qwen2 and qwen3 (worker/lm/arch_llama.cc implements it; each
// arch is its own file that names its variant): Hugging Face's LlamaForCausalLM and the families that differ from it
// only in switches, with Hugging Face's parameter names, so the state dict is the family's checkpoint:
//   qwen2 (Qwen2ForCausalLM):   biases on q_proj, k_proj, v_proj (not o_proj).
//   qwen3 (Qwen3ForCausalLM):   q_norm / k_norm, an RMSNorm over each head's hd values of q and k before the rotary
//                               embedding (self_attn.{q,k}_norm.weight [hd]).
//   mistral (MistralForCausalLM): model.sliding_window (a position attends to the last sliding_window positions).
// Every one of them takes model.head_dim (hd independent of d_model / n_head) and model.rope_type (worker/lm/rope.h).
// Thread-safety: as LanguageModel (one instance per thread).
#pragma once

#include "config/config.h"
#include "worker/lm/language_model.h"

namespace diloco {

struct LlamaVariant {
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3
};

// Throws std::invalid_argument for shapes the decoder cannot run (odd head size, n_head not a multiple of n_kv_head).
LanguageModelPtr MakeLlamaFamily(const ModelConfig& config, const LlamaVariant& variant);

}  // namespace diloco
