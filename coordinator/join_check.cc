#include "coordinator/join_check.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config_enums.h"

namespace diloco {
namespace {

std::string Joined(const std::vector<std::string>& diffs) {
  std::string out;
  for (const std::string& d : diffs) absl::StrAppend(&out, out.empty() ? "" : "; ", d);
  return out;
}

}  // namespace

std::string ModelMismatch(const ModelSpec& w, const ModelConfig& c) {
  std::vector<std::string> diffs;
  auto check = [&](const char* key, int64_t worker, int64_t coordinator) {
    if (worker != coordinator) {
      diffs.push_back(absl::StrCat("model.", key, ": worker has ", worker, ", coordinator has ", coordinator));
    }
  };
  check("vocab_size", w.vocab_size(), c.vocab_size);
  check("seq_len", w.seq_len(), c.seq_len);
  check("n_layer", w.n_layer(), c.n_layer);
  check("n_head", w.n_head(), c.n_head);
  check("d_model", w.d_model(), c.d_model);
  ModelConfig declared;  // the worker's settings, proto defaults read as config defaults
  if (!w.arch().empty() && !EnumFromName(w.arch(), &declared.arch)) {
    diffs.push_back(absl::StrCat("model.arch: worker has an unknown '", w.arch().substr(0, 32), "', coordinator has ",
                                 std::string(EnumName(c.arch))));
  } else if (declared.arch != c.arch) {
    diffs.push_back(absl::StrCat("model.arch: worker has ", std::string(EnumName(declared.arch)), ", coordinator has ",
                                 std::string(EnumName(c.arch))));
  }
  declared.seq_len = w.seq_len();
  declared.n_head = w.n_head();
  declared.d_model = w.d_model();
  declared.n_kv_head = w.n_kv_head();
  declared.ffn_hidden = w.ffn_hidden();
  declared.max_positions = w.max_positions();
  check("n_kv_head", declared.KvHeads(), c.KvHeads());
  check("ffn_hidden", declared.FfnHidden(), c.FfnHidden());
  check("max_positions", declared.MaxPositions(), c.MaxPositions());
  auto check_real = [&](const char* key, double worker, double coordinator) {
    if (worker != coordinator) {
      diffs.push_back(absl::StrCat("model.", key, ": worker has ", worker, ", coordinator has ", coordinator));
    }
  };
  check_real("rope_theta", w.rope_theta() > 0 ? w.rope_theta() : declared.rope_theta, c.rope_theta);
  check_real("norm_eps", w.norm_eps() > 0 ? w.norm_eps() : declared.norm_eps, c.norm_eps);
  if (w.untied_head() == c.tie_embeddings) {
    diffs.push_back(
        absl::StrCat("model.tie_embeddings: worker has ", !w.untied_head(), ", coordinator has ", c.tie_embeddings));
  }
  // The shape-free settings (rope scaling, the sliding window, head_dim): the fingerprint cannot tell them apart.
  // Workers since 2026-12-06 always send rope_type; a client that sends none (an older one) is not checked on them.
  if (w.rope_type().empty()) return Joined(diffs);
  if (!EnumFromName(w.rope_type(), &declared.rope_type)) {
    diffs.push_back(absl::StrCat("model.rope_type: worker has an unknown '", w.rope_type().substr(0, 32),
                                 "', coordinator has ", std::string(EnumName(c.rope_type))));
  } else if (declared.rope_type != c.rope_type) {
    diffs.push_back(absl::StrCat("model.rope_type: worker has ", std::string(EnumName(declared.rope_type)),
                                 ", coordinator has ", std::string(EnumName(c.rope_type))));
  }
  auto or_default = [](double v, double fallback) { return v != 0 ? v : fallback; };
  check_real("rope_factor", or_default(w.rope_factor(), declared.rope_factor), c.rope_factor);
  check_real("rope_low_freq_factor", or_default(w.rope_low_freq_factor(), declared.rope_low_freq_factor),
             c.rope_low_freq_factor);
  check_real("rope_high_freq_factor", or_default(w.rope_high_freq_factor(), declared.rope_high_freq_factor),
             c.rope_high_freq_factor);
  declared.rope_original_max_positions = w.rope_original_max_positions();
  check("rope_original_max_positions", declared.RopeOriginalMaxPositions(), c.RopeOriginalMaxPositions());
  check_real("rope_attention_factor", w.rope_attention_factor(), c.rope_attention_factor);
  check_real("rope_beta_fast", or_default(w.rope_beta_fast(), declared.rope_beta_fast), c.rope_beta_fast);
  check_real("rope_beta_slow", or_default(w.rope_beta_slow(), declared.rope_beta_slow), c.rope_beta_slow);
  check("sliding_window", w.sliding_window(), c.sliding_window);
  declared.head_dim = w.head_dim();
  check("head_dim", declared.HeadDim(), c.HeadDim());
  return Joined(diffs);
}

std::string DataMismatch(const DataSpec& worker, const DataSpec& coordinator) {
  std::vector<std::string> diffs;
  if (!worker.vocab_digest().empty() && !coordinator.vocab_digest().empty() &&
      worker.vocab_digest() != coordinator.vocab_digest()) {
    diffs.push_back(absl::StrCat(
        "the tokenizer: worker's vocabulary digest is ", worker.vocab_digest().substr(0, 32), ", coordinator's ",
        coordinator.vocab_digest(),
        " (the same token id would stand for another piece; give every process the same data.tokenizer file, e.g. "
        "the coordinator's token cache's tokenizer.model or tokenizer.json)"));
  }
  if (!worker.split().empty() && !coordinator.split().empty() && worker.split() != coordinator.split()) {
    diffs.push_back(absl::StrCat("data.split: worker has ", worker.split().substr(0, 32), ", coordinator has ",
                                 coordinator.split(), " (the workers' shards would overlap)"));
  }
  return Joined(diffs);
}

}  // namespace diloco
