#include "proto/status_json.h"

namespace diloco {

namespace {

nlohmann::json WorkerJson(const WorkerStatus& w) {
  return {{"id", w.id()},
          {"state", w.state()},
          {"rounds_contributed", w.rounds_contributed()},
          {"tokens", w.tokens()},
          {"last_loss", w.last_loss()},
          {"heartbeat_age_s", w.heartbeat_age_s()},
          {"shard_index", w.shard_index()},
          {"shard_reader", w.shard_reader()},
          {"tokens_per_s", w.tokens_per_s()},
          {"bytes_pushed", w.bytes_pushed()},
          {"bytes_pulled", w.bytes_pulled()},
          {"pushed_this_round", w.pushed_this_round()},
          {"cluster_size", w.cluster_size()},
          {"inner_steps", w.inner_steps()},
          {"data_epochs", w.data_epochs()},
          {"broken_pushes", w.broken_pushes()},
          {"quarantined_until_round", w.quarantined_until_round()},
          {"parts_received", w.parts_received()},
          {"parts", w.parts()},
          {"last_push_norm", w.last_push_norm()},
          {"last_clip_scale", w.last_clip_scale()},
          {"clipped_in_a_row", w.clipped_in_a_row()},
          {"pushes_in_parts", w.pushes_in_parts()},
          {"suspect", w.suspect()},
          {"duplicate_pushes", w.duplicate_pushes()},
          {"momentum_cosine", w.momentum_cosine()},
          {"momentum_bounded", w.momentum_bounded()},
          {"trimmed_share", w.trimmed_share()}};
}

nlohmann::json ModelJson(const ModelSpec& m) {
  return {{"arch", m.arch()},
          {"vocab_size", m.vocab_size()},
          {"seq_len", m.seq_len()},
          {"n_layer", m.n_layer()},
          {"n_head", m.n_head()},
          {"n_kv_head", m.n_kv_head()},
          {"d_model", m.d_model()},
          {"ffn_hidden", m.ffn_hidden()},
          {"max_positions", m.max_positions()},
          {"rope_theta", m.rope_theta()},
          {"norm_eps", m.norm_eps()},
          {"untied_head", m.untied_head()}};
}

}  // namespace

nlohmann::json StatusToJson(const StatusReply& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerStatus& w : s.workers()) workers.push_back(WorkerJson(w));
  nlohmann::json evals = nlohmann::json::array();
  for (const EvalPoint& e : s.evals()) {
    evals.push_back({{"round", e.round()},
                     {"val_loss", e.val_loss()},
                     {"tokens", e.tokens()},
                     {"bytes_pushed_committed", e.bytes_pushed_committed()}});
  }
  return {{"run_name", s.run_name()},
          {"round", s.round()},
          {"rounds_total", s.rounds_total()},
          {"fragments", s.fragments()},
          {"phase", s.phase()},
          {"phase_reason", s.phase_reason()},
          {"params", s.params()},
          {"fingerprint", s.fingerprint()},
          {"bytes_received", s.bytes_received()},
          {"bytes_sent", s.bytes_sent()},
          {"last_round_seconds", s.last_round_seconds()},
          {"last_outer_step_seconds", s.last_outer_step_seconds()},
          {"bytes_pushed_committed", s.bytes_pushed_committed()},
          {"last_round_bytes_pushed", s.last_round_bytes_pushed()},
          {"dp_equivalent_bytes", s.dp_equivalent_bytes()},
          {"dp_ratio", s.bytes_pushed_committed() > 0
                           ? static_cast<double>(s.dp_equivalent_bytes()) / s.bytes_pushed_committed()
                           : 0.0},
          {"model", ModelJson(s.model())},
          {"lease_ms", s.lease_ms()},
          {"heartbeat_interval_ms", s.heartbeat_interval_ms()},
          {"max_message_bytes", s.max_message_bytes()},
          {"chunk_bytes", s.chunk_bytes()},
          {"inner_steps", s.inner_steps()},
          {"workers", workers},
          {"members_not_listed", s.members_not_listed()},
          {"evals", evals}};
}

}  // namespace diloco
