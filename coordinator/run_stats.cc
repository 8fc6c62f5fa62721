#include "coordinator/run_stats.h"

#include <limits>

#include "config/model_spec.h"

namespace diloco {

void RunStats::CreditRound(const RoundState::Pushes& contributors, int64_t num_params, Membership& membership) {
  const double k = static_cast<double>(contributors.size());
  last_round_bytes_pushed = 0;
  for (const auto& [id, push] : contributors) {  // credited only once the round is committed
    if (Member* m = membership.Find(id)) {
      ++m->rounds_contributed;
      m->tokens += push.tokens;
      m->bytes_pushed += push.bytes;
      if (push.seconds > 0) m->steps_per_s = static_cast<double>(push.inner_steps) / push.seconds;
    }
    tokens_committed += push.tokens;
    last_round_bytes_pushed += push.bytes;
    // A peer's inner_steps (up to 2^31) x params can pass int64: the total saturates instead (a double beyond
    // int64's range does not convert).
    const double dp = static_cast<double>(push.inner_steps) * 2.0 * (k - 1) / k * 4.0 * static_cast<double>(num_params);
    const int64_t room = std::numeric_limits<int64_t>::max() - dp_equivalent_bytes;
    dp_equivalent_bytes += dp < static_cast<double>(room) ? static_cast<int64_t>(dp) : room;
  }
  bytes_pushed_committed += last_round_bytes_pushed;
}

namespace {

// Left and lost members listed in status, the most recently gone first (the rest are only counted), so the reply
// stays far below 1 MiB: active members are bounded by coordinator.max_members, ids by 128 characters.
constexpr size_t kListedGoneMembers = 64;

void AddWorkers(const StatusSources& in, double now, StatusReply& s) {
  std::vector<const Member*> listed;
  for (const auto& [id, m] : in.membership.members()) {
    if (m.state == MemberState::kActive) listed.push_back(&m);
  }
  const std::vector<const Member*> gone = in.membership.RecentlyGone(kListedGoneMembers);
  listed.insert(listed.end(), gone.begin(), gone.end());
  s.set_members_not_listed(static_cast<int64_t>(in.membership.gone_count() - gone.size()) + in.membership.forgotten());
  for (const Member* member : listed) {
    const Member& m = *member;
    const std::string& id = m.id;
    WorkerStatus* w = s.add_workers();
    w->set_id(id);
    w->set_state(MemberStateName(m.state));
    w->set_rounds_contributed(m.rounds_contributed);
    w->set_tokens(m.tokens);
    w->set_last_loss(m.last_loss);
    w->set_heartbeat_age_s(now - m.last_seen);
    w->set_shard_index(m.shard_index);
    w->set_shard_reader(m.shard_reader);
    w->set_tokens_per_s(m.last_tokens_per_s);
    w->set_bytes_pushed(m.bytes_pushed);
    w->set_bytes_pulled(m.bytes_pulled);
    w->set_pushed_this_round(in.round_state.HasPushed(id));
    w->set_cluster_size(m.cluster_size);
    w->set_inner_steps(m.inner_steps > 0 ? m.inner_steps : in.config.inner.steps);
    w->set_data_epochs(m.data_epochs);
    w->set_broken_pushes(m.broken_pushes);
    if (m.quarantined_until_round > in.round) w->set_quarantined_until_round(m.quarantined_until_round);
    w->set_last_push_norm(m.last_push_norm);
    w->set_last_clip_scale(m.last_clip_scale);
    w->set_clipped_in_a_row(m.clipped_in_a_row);
    w->set_pushes_in_parts(m.pushes_in_parts);
    w->set_suspect(m.suspect);
    w->set_duplicate_pushes(m.duplicate_pushes);
    w->set_momentum_cosine(m.momentum_cosine);
    w->set_momentum_bounded(m.momentum_bounded);
    w->set_trimmed_share(m.last_trimmed_share);
  }
}

}  // namespace

StatusReply BuildStatusReply(const StatusSources& in, double now) {
  StatusReply s;
  s.set_run_name(in.config.run.name);
  s.set_round(in.round);
  s.set_rounds_total(in.config.SyncRounds());
  s.set_fragments(in.fragments);
  s.set_phase(std::string(RoundPhaseName(in.round_state.phase())));
  s.set_phase_reason(in.round_state.phase_reason());
  s.set_params(in.params);
  s.set_fingerprint(in.fingerprint);
  s.set_bytes_received(in.stats.bytes_received);
  s.set_bytes_sent(in.stats.bytes_sent);
  s.set_last_round_seconds(in.stats.last_round_seconds);
  s.set_last_outer_step_seconds(in.stats.last_outer_step_seconds);
  s.set_bytes_pushed_committed(in.stats.bytes_pushed_committed);
  s.set_dp_equivalent_bytes(in.stats.dp_equivalent_bytes);
  s.set_last_round_bytes_pushed(in.stats.last_round_bytes_pushed);
  const Config& c = in.config;
  *s.mutable_model() = ModelSpecOf(c.model);
  s.set_lease_ms(static_cast<int64_t>(c.coordinator.lease_s * 1000));
  s.set_heartbeat_interval_ms(static_cast<int64_t>(c.coordinator.heartbeat_interval_s * 1000));
  s.set_max_message_bytes(MaxMessageBytes(c.comm.chunk_bytes));
  s.set_chunk_bytes(c.comm.chunk_bytes);
  s.set_inner_steps(c.inner.steps);
  AddWorkers(in, now, s);
  for (const EvalRecord& e : in.evals) {
    EvalPoint* p = s.add_evals();
    p->set_round(e.round);
    p->set_val_loss(e.val_loss);
    p->set_tokens(e.tokens);
    p->set_bytes_pushed_committed(e.bytes_pushed_committed);
  }
  return s;
}

}  // namespace diloco
