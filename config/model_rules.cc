#include "config/model_rules.h"

#include "absl/strings/str_cat.h"

namespace diloco {

// The model's cross-key rules, per architecture (worker/lm/language_model.h). Each key's own range is checked
// before, from its row in Fields() (config_fields.cc): here n_head, d_model and vocab_size are positive.
absl::Status ValidateModel(const ModelConfig& m) {
  const std::string arch(EnumName(m.arch));
  if (m.d_model % m.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.d_model (", m.d_model, ") must be divisible by model.n_head (", m.n_head, ")"));
  }
  if (m.arch != ModelArch::kLlama && m.KvHeads() != m.n_head) {
    return absl::InvalidArgumentError(absl::StrCat("model.n_kv_head: arch ", arch, " has no grouped-query attention (",
                                                   "only llama); leave it unset or equal to model.n_head"));
  }
  if (m.arch != ModelArch::kLlama && !m.tie_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("model.tie_embeddings: arch ", arch, " always ties its head"));
  }
  if (m.arch == ModelArch::kGpt &&
      (m.FfnHidden() != 4 * m.d_model || m.norm_eps != 1e-5 || m.MaxPositions() != m.seq_len)) {
    return absl::InvalidArgumentError(
        "model: arch gpt has a fixed MLP (4 x d_model), norm eps (1e-5) and position "
        "table (seq_len); use arch gpt2 to set ffn_hidden, norm_eps or max_positions");
  }
  if (m.n_head % m.KvHeads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_head (", m.n_head, ") must be a multiple of model.n_kv_head (", m.KvHeads(), ")"));
  }
  if (m.arch == ModelArch::kLlama && (m.d_model / m.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: llama's head size d_model / n_head must be even (rotary ",
                                                   "embedding), got ", m.d_model / m.n_head));
  }
  if (m.seq_len > m.MaxPositions()) {
    return absl::InvalidArgumentError(absl::StrCat("model.seq_len (", m.seq_len, ") exceeds the model's positions (",
                                                   "model.max_positions ", m.MaxPositions(), ")"));
  }
  for (int64_t id : {m.bos_token_id, m.eos_token_id}) {
    if (id >= m.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.bos_token_id / eos_token_id: -1 (none) or a token id below ", "model.vocab_size (",
                       m.vocab_size, "), got ", id));
    }
  }
  return absl::OkStatus();
}

}  // namespace diloco
