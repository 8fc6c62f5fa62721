#include "config/model_rules.h"

#include "absl/strings/str_cat.h"

namespace diloco {

namespace {

// head_dim, the rotary scaling and the sliding window: keys of the llama-shaped archs only.
absl::Status ValidateLlamaShaped(const ModelConfig& m) {
  const std::string arch(EnumName(m.arch));
  if (!m.LlamaShaped()) {
    if (m.head_dim != 0 || m.rope_type != RopeType::kDefault || m.sliding_window != 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.head_dim / rope_type / sliding_window: arch ", arch,
                                                     " has no rotary attention; leave them unset"));
    }
    return absl::OkStatus();
  }
  if (m.HeadDim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", arch, "'s head size (model.head_dim, or d_model / ",
                                                   "n_head) must be even (rotary embedding), got ", m.HeadDim()));
  }
  if (m.rope_type == RopeType::kLlama3 && m.rope_high_freq_factor <= m.rope_low_freq_factor) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_high_freq_factor (", m.rope_high_freq_factor,
                                                   ") must exceed model.rope_low_freq_factor (", m.rope_low_freq_factor,
                                                   ") for rope_type llama3"));
  }
  if (m.sliding_window != 0 && m.arch != ModelArch::kMistral) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.sliding_window: only arch mistral has a sliding attention window, not ", arch));
  }
  return absl::OkStatus();
}

}  // namespace

// The model's cross-key rules, per architecture (worker/lm/language_model.h). Each key's own range is checked
// before, from its row in Fields() (config_fields.cc): here n_head, d_model and vocab_size are positive.
absl::Status ValidateModel(const ModelConfig& m) {
  const std::string arch(EnumName(m.arch));
  if (m.head_dim == 0 && m.d_model % m.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", m.d_model,
                                                   ") must be divisible by model.n_head (", m.n_head,
                                                   ") unless model.head_dim is set"));
  }
  if (!m.LlamaShaped() && m.KvHeads() != m.n_head) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_kv_head: arch ", arch, " has no grouped-query attention (",
                     "only llama-shaped archs); leave it unset or equal to model.n_head"));
  }
  if (!m.LlamaShaped() && !m.tie_embeddings) {
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
  if (absl::Status s = ValidateLlamaShaped(m); !s.ok()) return s;
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
