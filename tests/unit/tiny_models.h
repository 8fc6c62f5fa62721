// Tiny model configs of the non-default architectures for unit tests (shapes only; a few thousand parameters):
// a Llama with grouped-query attention (4 heads, 2 key/value heads) and rope_theta 500000, tied or untied, and a GPT-2.
#pragma once

#include "config/config.h"

namespace diloco {

inline ModelConfig TinyLlama(bool tied) {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.vocab_size = 64;
  m.seq_len = 16;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 32;
  m.ffn_hidden = 48;
  m.max_positions = 32;
  m.rope_theta = 500000;
  m.tie_embeddings = tied;
  return m;
}

inline ModelConfig TinyGpt2() {
  ModelConfig m;
  m.arch = ModelArch::kGpt2;
  m.vocab_size = 64;
  m.seq_len = 16;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 32;
  m.ffn_hidden = 40;
  m.max_positions = 24;
  return m;
}

}  // namespace diloco
