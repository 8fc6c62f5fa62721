#include "proto/status_text.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace diloco {

std::string StatusToText(const StatusReply& s) {
  std::string out;
  // `round` counts the committed outer steps; the round under way is the next one, numbered as the logs number it
  // ("round 25: waiting for pushes" while 24 are done).
  absl::StrAppendFormat(&out, "run %s: %lld/%lld rounds done; ", s.run_name(), static_cast<long long>(s.round()),
                        static_cast<long long>(s.rounds_total()));
  if (s.phase() == "complete" || s.round() >= s.rounds_total()) {  // finishing: the last round's checkpoint
    absl::StrAppend(&out, s.phase(), s.phase_reason().empty() ? "" : ": ", s.phase_reason(), "\n");
  } else {
    absl::StrAppendFormat(&out, "round %lld %s%s%s\n", static_cast<long long>(s.round() + 1), s.phase(),
                          s.phase_reason().empty() ? "" : ": ", s.phase_reason());
  }
  absl::StrAppendFormat(&out, "model: %lld parameters, fingerprint %s\n", static_cast<long long>(s.params()),
                        s.fingerprint());
  const ModelSpec& m = s.model();
  absl::StrAppendFormat(
      &out,
      "model settings: arch %s, vocab %lld, seq_len %lld, layers %lld, heads %lld (kv %lld), d_model %lld, ffn %lld\n",
      m.arch(), static_cast<long long>(m.vocab_size()), static_cast<long long>(m.seq_len()),
      static_cast<long long>(m.n_layer()), static_cast<long long>(m.n_head()), static_cast<long long>(m.n_kv_head()),
      static_cast<long long>(m.d_model()), static_cast<long long>(m.ffn_hidden()));
  absl::StrAppendFormat(
      &out, "protocol: H %lld, fragments %d, chunk %lld B, max message %lld B, lease %lld ms, heartbeat %lld ms\n",
      static_cast<long long>(s.inner_steps()), std::max(1, s.fragments()), static_cast<long long>(s.chunk_bytes()),
      static_cast<long long>(s.max_message_bytes()), static_cast<long long>(s.lease_ms()),
      static_cast<long long>(s.heartbeat_interval_ms()));
  absl::StrAppendFormat(&out, "traffic: %.2f MB received, %.2f MB sent; last round %.2f s (outer step %.3f s)\n",
                        s.bytes_received() / 1e6, s.bytes_sent() / 1e6, s.last_round_seconds(),
                        s.last_outer_step_seconds());
  if (s.bytes_pushed_committed() > 0 && s.dp_equivalent_bytes() > 0) {
    absl::StrAppendFormat(
        &out, "pushed %.2f MB in committed rounds; data parallel would have sent %.2f MB for the same steps (%.1fx)\n",
        s.bytes_pushed_committed() / 1e6, s.dp_equivalent_bytes() / 1e6,
        static_cast<double>(s.dp_equivalent_bytes()) / s.bytes_pushed_committed());
  }
  absl::StrAppendFormat(&out, "%-16s %-7s %6s %5s %5s %7s %12s %10s %10s %7s %9s\n", "worker", "state", "shard",
                        "procs", "H", "rounds", "tokens", "tokens/s", "last_loss", "epochs", "hb_age_s");
  for (const auto& w : s.workers()) {
    // A shared shard shows its reader: 0/1 is shard 0's second reader.
    const std::string shard =
        w.shard_reader() > 0 ? absl::StrCat(w.shard_index(), "/", w.shard_reader()) : absl::StrCat(w.shard_index());
    absl::StrAppendFormat(&out, "%-16s %-7s %6s %5d %5lld %7lld %12lld %10.0f %10.4f %7.3f %9.1f\n", w.id(), w.state(),
                          shard, std::max(1, w.cluster_size()), static_cast<long long>(w.inner_steps()),
                          static_cast<long long>(w.rounds_contributed()), static_cast<long long>(w.tokens()),
                          w.tokens_per_s(), w.last_loss(), w.data_epochs(), w.heartbeat_age_s());
  }
  if (s.members_not_listed() > 0) {
    absl::StrAppendFormat(&out, "(%lld more members that left or were lost are not listed)\n",
                          static_cast<long long>(s.members_not_listed()));
  }
  std::vector<std::string> clipped;  // outer.aggregation clip: members scaled a little, not counted
  std::vector<std::string> bounded;  // outer.momentum_bound: the same along the momentum
  for (const auto& w : s.workers()) {
    if (w.quarantined_until_round() > 0) {
      absl::StrAppendFormat(&out, "quarantined: %s through round %lld (%lld broken pushes)\n", w.id(),
                            static_cast<long long>(w.quarantined_until_round()),
                            static_cast<long long>(w.broken_pushes()));
    }
    if (w.duplicate_pushes() > 0) {
      absl::StrAppendFormat(&out, "duplicate: %s had %lld pushes refused as copies or replays of another push\n",
                            w.id(), static_cast<long long>(w.duplicate_pushes()));
    }
    if (w.parts() > 0)
      absl::StrAppendFormat(&out, "push in parts: %s %d/%d parts in\n", w.id(), w.parts_received(), w.parts());
    if (w.suspect() || w.clipped_in_a_row() > 0) {  // outer.flag_margin, outer.flag_rounds
      std::string how;                              // what held it back: a clip, the bound along the momentum, the trim
      if (w.last_clip_scale() > 0 && w.last_clip_scale() < 1)
        absl::StrAppendFormat(&how, " scaled by %.3g", w.last_clip_scale());
      if (w.momentum_bounded())
        absl::StrAppendFormat(&how, ", bounded along the outer momentum (cosine %.3g)", w.momentum_cosine());
      else if (w.momentum_cosine() != 0)  // watched, not bounded (a coordinate-wise rule, or within clip's bound)
        absl::StrAppendFormat(&how, ", cosine %.3g with the outer momentum", w.momentum_cosine());
      if (w.trimmed_share() > 0)
        absl::StrAppendFormat(&how, ", dropped by the trim at %.1f%% of its coordinates", 100 * w.trimmed_share());
      absl::StrAppendFormat(&out, "%s: %s last push norm %.4g%s; far beyond the limits %lld rounds in a row%s\n",
                            w.suspect() ? "suspect" : "far beyond", w.id(), w.last_push_norm(), how,
                            static_cast<long long>(w.clipped_in_a_row()),
                            w.suspect() ? absl::StrCat(" (operators decide: diloco-ctl leave --id ", w.id(), ")") : "");
    } else if (w.last_clip_scale() > 0 && w.last_clip_scale() < 1) {  // within the margin: one line for them all
      clipped.push_back(absl::StrFormat("%s x%.3g", w.id(), w.last_clip_scale()));
    }
    if (w.momentum_bounded() && !w.suspect() && w.clipped_in_a_row() == 0) {  // outer.momentum_bound
      bounded.push_back(absl::StrFormat("%s (cosine %.3g)", w.id(), w.momentum_cosine()));
    }
  }
  if (!clipped.empty()) {
    absl::StrAppend(&out, "clipped within the flag margin: ", absl::StrJoin(clipped, ", "), "\n");
  }
  if (!bounded.empty()) {
    absl::StrAppend(&out, "bounded along the outer momentum within the flag margin: ", absl::StrJoin(bounded, ", "),
                    "\n");
  }
  if (s.evals_size() > 0) {
    absl::StrAppend(&out, "val_loss:");
    for (const auto& e : s.evals())
      absl::StrAppendFormat(&out, " r%lld=%.4f", static_cast<long long>(e.round()), e.val_loss());
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace diloco
