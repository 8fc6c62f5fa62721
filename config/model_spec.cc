// ModelSpecOf (config/model_spec.h).
#include "config/model_spec.h"

#include <string>

#include "config/config_enums.h"

namespace diloco {

ModelSpec ModelSpecOf(const ModelConfig& m) {
  ModelSpec spec;
  spec.set_vocab_size(m.vocab_size);
  spec.set_seq_len(m.seq_len);
  spec.set_n_layer(m.n_layer);
  spec.set_n_head(m.n_head);
  spec.set_d_model(m.d_model);
  spec.set_arch(std::string(EnumName(m.arch)));
  spec.set_n_kv_head(m.KvHeads());
  spec.set_ffn_hidden(m.FfnHidden());
  spec.set_max_positions(m.MaxPositions());
  spec.set_rope_theta(m.rope_theta);
  spec.set_norm_eps(m.norm_eps);
  spec.set_untied_head(!m.tie_embeddings);
  spec.set_rope_type(std::string(EnumName(m.rope_type)));
  spec.set_rope_factor(m.rope_factor);
  spec.set_rope_low_freq_factor(m.rope_low_freq_factor);
  spec.set_rope_high_freq_factor(m.rope_high_freq_factor);
  spec.set_rope_original_max_positions(m.RopeOriginalMaxPositions());
  spec.set_rope_attention_factor(m.rope_attention_factor);
  spec.set_rope_beta_fast(m.rope_beta_fast);
  spec.set_rope_beta_slow(m.rope_beta_slow);
  spec.set_sliding_window(m.sliding_window);
  spec.set_head_dim(m.HeadDim());
  return spec;
}

DataSpec DataSpecOf(const Config& config, const std::string& vocab_digest) {
  DataSpec spec;
  spec.set_vocab_digest(vocab_digest);
  spec.set_split(std::string(EnumName(config.data.split)));
  return spec;
}

}  // namespace diloco
