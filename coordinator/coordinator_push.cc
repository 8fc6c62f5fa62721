// CoordinatorCore, the push path (coordinator.h): BeginPush admits a push, FoldChunk adds its chunks to the round's
// sums, CommitPush counts it, AbortPush undoes a push that broke off. The rules for which round a push may be for
// are round_policy.h's DecidePushRound; the bookkeeping is round_state.h's.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"
#include "proto/peer_text.h"

namespace diloco {

absl::Status CoordinatorCore::CheckPushHeader(const PushHeader& header) {
  const std::string& id = header.meta().worker_id();
  const Member* m = membership_.Find(id);
  if (m != nullptr && clock_() - m->last_seen > config_.coordinator.lease_s) {
    // Silent past its lease (the round loop marks it lost at its next pass): it must join again before it counts.
    return absl::NotFoundError(absl::StrCat("worker '", id, "' lease expired (silent for ", clock_() - m->last_seen,
                                            " s > coordinator.lease_s ", config_.coordinator.lease_s, "); Join again"));
  }
  if (complete_) return absl::FailedPreconditionError("the run is complete");
  if (m != nullptr && m->quarantined_until_round > theta_->round()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", id, "' is quarantined through round ", m->quarantined_until_round, " (", m->quarantine_reason,
        "); pull the current parameters and push from round ", m->quarantined_until_round + 1, " on"));
  }
  // A resend of a push that counted (its reply was lost: the stream broke or timed out after its last chunk, or the
  // member rejoined) is answered "counted", before the round rules, which would call it late: the worker would take
  // its push for one that did not count (rolling its error feedback back, or with late_policy reuse_local keeping
  // its local parameters), and async would apply it a second time.
  const bool async = config_.outer.mode == OuterMode::kAsync;
  if (m != nullptr && header.meta().round() <= m->last_applied_base) {
    if (!async) {
      return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' already pushed for round ",
                                                   header.meta().round() + 1, " (counted in that round's outer step)"));
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "worker '", id, "''s push computed against version ", header.meta().round(),
        " was applied already (its newest applied push was computed against version ", m->last_applied_base, ")"));
  }
  if (!async && header.meta().round() == theta_->round() && round_.CountsAsPushed(id)) {
    // Counted in the open round, or among the contributors being stepped (if that step is discarded, a non-finite
    // result, heartbeats say `pushed = false` and the member pushes again for the redo).
    return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' already pushed for round ", theta_->round() + 1,
                                                 round_.HasPushed(id) ? "" : " (its outer step is under way)"));
  }
  absl::Status s =
      DecidePushRound({theta_->round(), header.meta().round(), round_.phase()}, PushRoundOptionsOf(config_));
  if (!s.ok()) return s;
  if (const uint64_t held = header.meta().theta_id(); held != 0) {
    const auto it = theta_ids_.find(header.meta().round());
    if (it != theta_ids_.end() && it->second != held) {
      // The worker's theta of that round came from before a restart that resumed from an older checkpoint and
      // stepped the round again: its pseudo-gradient is against another theta.
      return absl::FailedPreconditionError(absl::StrCat(
          "push for round ", header.meta().round() + 1, " refused: computed against another theta of that round than ",
          "this coordinator's (it resumed from an older checkpoint and stepped the round again); pull the current ",
          "parameters"));
    }
  }
  if (round_.HasPushed(id)) {  // async (sync: above)
    return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' already pushed for round ", theta_->round() + 1));
  }
  if (header.parts() < 0 || (header.parts() <= 1 && (header.part() != 0 || header.has_range()))) {
    return absl::InvalidArgumentError(absl::StrCat("push header: part ", header.part(), " of ", header.parts(),
                                                   " parts (a range is only for a push in parts > 1)"));
  }
  if (header.parts() <= 1 && parts_.Progress(id).second > 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' has a push in parts under way for round ",
                                                      theta_->round() + 1, "; finish it or let it break first"));
  }
  if (round_.IsStreaming(id)) {  // e.g. a retry while the first stream is still open: never count a worker twice
    return absl::UnavailableError(absl::StrCat("a push from worker '", id, "' for round ", theta_->round() + 1,
                                               " is still streaming; retry later"));
  }
  if (header.tokens() <= 0 || header.tokens() > (int64_t{1} << 40) || header.inner_steps() < 0 ||
      header.inner_steps() > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("push header: tokens (", header.tokens(), ") must be in [1, 2^40]",
                                                   " and inner_steps (", header.inner_steps(), ") in [0, 2^31]"));
  }
  if (!std::isfinite(header.data_epochs()) || header.data_epochs() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push header: data_epochs (", header.data_epochs(), ") must be finite and >= 0"));
  }
  if (!std::isfinite(header.loss()) || !std::isfinite(header.seconds()) || header.seconds() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("push header: loss (", header.loss(), ") must be finite and ",
                                                   "seconds (", header.seconds(), ") finite and >= 0"));
  }
  // A config mismatch (a worker that joined without saying push_parts): INVALID_ARGUMENT, since pushing again cannot
  // help; the worker gives up with this line instead of retraining every round to be refused.
  if (const std::string parts = PushPartsMismatch(config_, header.parts()); !parts.empty()) {
    return absl::InvalidArgumentError(parts);
  }
  const int fragment = static_cast<int>(theta_->round() % fragments());
  if (header.fragment() != fragment) {
    return absl::InvalidArgumentError(absl::StrCat("push of fragment ", header.fragment(), " refused: round ",
                                                   theta_->round() + 1, " syncs fragment ", fragment, " of ",
                                                   fragments()));
  }
  return absl::OkStatus();
}

absl::StatusOr<PushTicket> CoordinatorCore::BeginPush(const PushHeader& header) {
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckMeta(header.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  s = CheckPushHeader(header);
  if (!s.ok()) {
    // A refused part breaks its member's whole push in parts (push_parts.h), unless it is of an older attempt.
    const std::optional<uint64_t> under_way = parts_.AttemptOf(header.meta().worker_id());
    if (header.parts() > 1 && under_way.has_value() && header.attempt() >= *under_way) {
      DiscardParts(header.meta().worker_id(), std::string(s.message()));
    }
    return s;
  }
  const std::string& id = header.meta().worker_id();
  membership_.Touch(id, clock_());
  PushTicket t;
  t.worker_id = id;
  t.stream_key = id;
  t.round = theta_->round();
  t.base = header.meta().round();
  t.fragment = static_cast<int>(theta_->round() % fragments());
  t.epoch = round_.epoch();
  t.weight = static_cast<double>(header.tokens());  // outer.aggregation clip may cap it (AdmitToClip)
  t.tokens = header.tokens();
  t.inner_steps = header.inner_steps();
  t.loss = header.loss();
  t.seconds = header.seconds();
  t.data_epochs = header.data_epochs();
  if (config_.outer.aggregation == Aggregation::kClip && config_.outer.mode == OuterMode::kSync) {
    if (absl::Status admitted = AdmitToClip(header, t); !admitted.ok()) return admitted;
  }
  if (CoordinateWiseRounds()) {
    if (absl::Status admitted = AdmitToWindow(header, t); !admitted.ok()) return admitted;
  }
  if (header.parts() > 1) {
    s = BeginPart(header, t);
    if (!s.ok()) return s;
  }
  t.stream = round_.StartStream(t.stream_key, clock_());
  return t;
}

absl::Status CoordinatorCore::FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                                        int64_t wire_bytes) {
  if (wire_bytes < 0) wire_bytes = values.numel() * values.element_size();
  if (index >= model_.specs.size() || offset < 0 || offset + values.numel() > model_.specs[index].numel()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk outside the model: tensor ", index, " elements [", offset,
                                                   ", ", offset + values.numel(), ")"));
  }
  if (!AllFinite(values)) {
    return absl::InvalidArgumentError(absl::StrCat("pseudo-gradient of '", model_.specs[index].name,
                                                   "' holds NaN or Inf near element ", offset, "; push refused"));
  }
  const double squared_norm = SquaredNorm(values);  // outside the lock: the push's norm (aggregation_rule.h)
  const uint64_t chunk_hash = ChunkHash(index, offset, values);  // and its part of the payload hash
  const double momentum_dot = MomentumDot(ticket.momentum.get(), index, offset, values);  // outer.momentum_bound
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AdmitFold(ticket); !s.ok()) return s;
  if (CoordinateWiseRounds()) {  // trimmed_mean, centered_clip: through the window (coordinator_window.cc)
    if (absl::Status s = FoldToWindow(ticket, index, offset, values); !s.ok()) return s;
  } else {
    // comm.topk_average senders counts the push's own weight (a clip scale shrinks only its values), as FoldSparse.
    accumulator_.Fold(index, offset, values, ticket.weight * ticket.fold_scale, ticket.weight);
  }
  ticket.momentum_dot += momentum_dot;
  NoteFold(ticket, squared_norm, chunk_hash, wire_bytes);
  return absl::OkStatus();
}

absl::Status CoordinatorCore::AdmitFold(const PushTicket& ticket) const {
  if (ticket.round != theta_->round() || round_.phase() != RoundPhase::kTraining) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", ticket.round + 1, " closed while the push was streaming"));
  }
  // A part of a discarded assembly first: its stream may have been replaced by the same part of a newer attempt.
  if (absl::Status s = StalePartRefusal(ticket); !s.ok()) return s;
  if (!round_.IsCurrent(ticket.stream_key, ticket.stream)) return CutRefusal(ticket);
  if (ticket.epoch != round_.epoch()) {
    return absl::AbortedError("the round's aggregation restarted after a broken push; push again");
  }
  return absl::OkStatus();
}

void CoordinatorCore::NoteFold(PushTicket& ticket, double squared_norm, uint64_t chunk_hash, int64_t wire_bytes) {
  ticket.folded_any = true;
  ticket.payload_hash = ChainHash(ticket.payload_hash, chunk_hash);
  ticket.squared_norm += squared_norm;
  round_.MarkFolded(ticket.stream_key, clock_());
  if (ticket.parts > 1) parts_.MarkFolded(ticket.worker_id, clock_());
  ticket.bytes += wire_bytes;
  stats_.bytes_received += wire_bytes;
}

absl::Status CoordinatorCore::CommitPush(PushTicket& ticket) {
  absl::MutexLock lock(&mu_);
  const bool current = round_.IsCurrent(ticket.stream_key, ticket.stream);
  if (!ticket.finished) round_.EndStream(ticket.stream_key, ticket.stream);
  ticket.finished = true;
  if (ticket.round != theta_->round() || round_.phase() != RoundPhase::kTraining) {
    return absl::FailedPreconditionError(absl::StrCat("round ", ticket.round + 1, " closed before the push completed"));
  }
  if (absl::Status s = StalePartRefusal(ticket); !s.ok()) return s;
  if (!current) return CutRefusal(ticket);
  if (ticket.epoch != round_.epoch()) return absl::AbortedError("the round's aggregation restarted; push again");
  if (absl::Status s = CheckClaimedNorm(ticket); !s.ok()) return s;
  if (absl::Status s = CheckDuplicate(ticket); !s.ok()) return s;
  if (ticket.parts > 1) return CommitPart(ticket);
  if (CoordinateWiseRounds() && !window_.Finish(ticket.worker_id)) {  // its chunks are in the window: restart
    const std::string why = "the push's chunk count differs from the other pushes' of the round";
    RestartAggregation(ticket.worker_id, ticket.round, why, /*cut_as_stalled=*/false);
    return absl::InvalidArgumentError(why);
  }
  return CountPush(ticket);
}

absl::Status CoordinatorCore::CountPush(const PushTicket& ticket) {
  accumulator_.AddContribution(ticket.weight);
  round_.Count(ticket);
  if (Member* m = membership_.Find(ticket.worker_id)) {
    m->strikes = 0;
    m->last_loss = ticket.loss;
    m->last_tokens_per_s = ticket.seconds > 0 ? ticket.tokens / ticket.seconds : 0;
    m->data_epochs = ticket.data_epochs;
    RecordPushNorm(*m, ticket);
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

void CoordinatorCore::AbortPush(PushTicket& ticket, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (ticket.finished) return;
  ticket.finished = true;
  const bool current = round_.IsCurrent(ticket.stream_key, ticket.stream);
  round_.EndStream(ticket.stream_key, ticket.stream);
  if (ticket.parts > 1 && parts_.IsCurrent(ticket.worker_id, ticket.generation)) {
    DiscardParts(ticket.worker_id,
                 absl::StrCat("part ", ticket.part, " broke off: ", why));  // breaks the member's push
    return;
  }
  // A member of a coordinate-wise rule's set breaks the round's window even before its first chunk.
  const bool windowed = CoordinateWiseRounds() && window_.Holds(ticket.worker_id);
  if (!current || !(ticket.folded_any || windowed) || ticket.epoch != round_.epoch() || ticket.round != theta_->round())
    return;
  // Some of this push is in the sums and the rest never came: discard the round's aggregation so far.
  RestartAggregation(ticket.worker_id, ticket.round, why, /*cut_as_stalled=*/false);
}

void CoordinatorCore::RestartAggregation(const std::string& id, int64_t round, const std::string& why,
                                         bool cut_as_stalled) {
  const size_t dropped = DiscardAggregation();
  spdlog::warn("push from {} for round {} broke off ({}); restarting the round's aggregation, {} worker(s) push again",
               id, round + 1, Truncated(why, 512), dropped);
  RecordBrokenPush(id, cut_as_stalled);
  cv_.SignalAll();
}

void CoordinatorCore::RecordBrokenPush(const std::string& id, bool cut_as_stalled) {
  Member* m = membership_.Find(id);
  if (m == nullptr) return;
  ++m->broken_pushes;
  ++m->strikes;
  const int64_t rounds = QuarantineRounds(m->strikes, cut_as_stalled);
  if (rounds == 0) return;
  m->quarantined_until_round = theta_->round() + rounds;
  m->quarantine_reason =
      absl::StrCat(m->strikes, " broken pushes in a row", cut_as_stalled ? ", the last one stalled" : "");
  spdlog::warn("quarantined: worker {} through round {} ({}); its pushes are refused and no round waits for it", id,
               m->quarantined_until_round, m->quarantine_reason);
}

void CoordinatorCore::CutStalledPushes(double now) {
  bool restart = false;
  std::set<std::string> broken;  // members with a stalled stream or parts in the sums
  for (const std::string& key :
       round_.StalledStreams(now, config_.coordinator.lease_s, config_.coordinator.round_timeout_s)) {
    const std::string id = key.substr(0, key.find('#'));  // a part's stream key is id#part
    bool folded = round_.CutStream(key);
    if (parts_.Discard(id, /*stalled=*/true) || window_.Holds(id)) folded = true;
    spdlog::warn(
        "push from {} for round {} cut as late: the round is due to close and the stream made no progress "
        "for coordinator.lease_s {} s (or was open longer than round_timeout_s){}",
        id, theta_->round() + 1, config_.coordinator.lease_s, folded ? "; it had chunks in the sums" : "");
    if (folded) broken.insert(id);
  }
  for (const std::string& id : parts_.Stalled(now, config_.coordinator.lease_s, config_.coordinator.round_timeout_s)) {
    spdlog::warn("push in parts from {} for round {} cut as late: {} of its parts made no progress for lease_s", id,
                 theta_->round() + 1, parts_.Progress(id).second - parts_.Progress(id).first);
    if (parts_.Discard(id, /*stalled=*/true)) broken.insert(id);
  }
  for (const std::string& id : broken) {
    restart = true;
    RecordBrokenPush(id, /*cut_as_stalled=*/true);
  }
  if (!restart) return;
  const size_t dropped = DiscardAggregation();
  spdlog::warn("round {}: restarting the aggregation after a stalled push was cut; {} worker(s) push again",
               theta_->round() + 1, dropped);
}

size_t CoordinatorCore::DiscardAggregation() {
  accumulator_.Reset();
  parts_.Clear();
  clip_gate_.Reset();
  window_.Reset();
  aggregation_restarted_at_ = clock_();
  return round_.RestartAggregation();
}

double CoordinatorCore::RoundClockStart() const {
  const double timeout = config_.coordinator.round_timeout_s;
  return std::max(round_.opened_at(),
                  aggregation_restarted_at_ + std::min(config_.coordinator.lease_s, timeout) - timeout);
}

bool CoordinatorCore::ForceSetNow() const {
  return clock_() - RoundClockStart() >= config_.coordinator.round_timeout_s;
}

size_t CoordinatorCore::HeadersNeeded(bool force, size_t expected) const {
  const int64_t min_workers = config_.coordinator.min_workers;
  return static_cast<size_t>(force ? PushesNeeded(min_workers, QuarantinedActiveCount(), expected) : min_workers);
}

size_t CoordinatorCore::QuarantinedActiveCount() const {
  size_t n = 0;
  for (const std::string& id : membership_.ActiveIds()) {
    const Member* m = membership_.Find(id);
    if (m != nullptr && m->quarantined_until_round > theta_->round()) ++n;
  }
  return n;
}

std::vector<std::string> CoordinatorCore::UnquarantinedActiveIds() const {
  std::vector<std::string> ids;
  for (const std::string& id : membership_.ActiveIds()) {
    const Member* m = membership_.Find(id);
    if (m == nullptr || m->quarantined_until_round <= theta_->round()) ids.push_back(id);
  }
  return ids;
}

absl::Status CoordinatorCore::CutRefusal(const PushTicket& ticket) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "push from worker '", ticket.worker_id, "' for round ", ticket.round + 1,
      " cut as late: the round was due to close and this stream made no progress for coordinator.lease_s (",
      config_.coordinator.lease_s, " s) or was open longer than round_timeout_s (", config_.coordinator.round_timeout_s,
      " s); pull the current parameters"));
}

absl::Status CoordinatorCore::AdmitToClip(const PushHeader& header, PushTicket& ticket) {
  const double norm = header.claimed_norm();
  if (!std::isfinite(norm) || norm <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push header: claimed_norm (", norm, ") must be finite and > 0 with outer.aggregation clip"));
  }
  clip_gate_.Declare(header.meta().worker_id(), norm, static_cast<double>(header.tokens()));
  if (!clip_gate_.open()) {
    const std::vector<std::string> expected = UnquarantinedActiveIds();
    clip_gate_.KeepOnly(expected);  // a member lost since it declared: its claim goes
    const bool force = ForceSetNow();
    if (!clip_gate_.TryOpen(expected, force, HeadersNeeded(force, expected.size()))) {
      return absl::UnavailableError(absl::StrCat("outer.aggregation clip: waiting for the round's other push headers (",
                                                 clip_gate_.declared(), " of ", expected.size(), " declared); retry"));
    }
    spdlog::info("round {}: clip fold open with {} pushes declared: median norm {:.4g}, median tokens {}",
                 theta_->round() + 1, clip_gate_.declared(), clip_gate_.median_norm(), clip_gate_.median_tokens());
  }
  ticket.claimed_norm = norm;
  ticket.momentum = axis_;  // outer.momentum_bound: null when it does not apply
  ticket.fold_scale = clip_gate_.Scale(norm);
  ticket.weight = clip_gate_.Weight(ticket.weight);
  return absl::OkStatus();
}

absl::Status CoordinatorCore::CheckClaimedNorm(const PushTicket& ticket) {
  if (ticket.claimed_norm < 0) return absl::OkStatus();
  constexpr double kTolerance = 0.02;  // relative: room for a lossy codec's rounding (docs/operations.md)
  const double real = std::sqrt(ticket.squared_norm);
  if (std::fabs(real - ticket.claimed_norm) <= kTolerance * ticket.claimed_norm) return absl::OkStatus();
  const std::string why = absl::StrCat("push from worker '", ticket.worker_id, "' claimed norm ", ticket.claimed_norm,
                                       " but its values have norm ", real, "; push refused");
  if (ticket.folded_any) {
    const size_t dropped = DiscardAggregation();
    spdlog::warn("{}; restarting the round's aggregation, {} worker(s) push again", why, dropped);
  }
  QuarantineForRound(ticket.worker_id, "its claimed norm did not match its values");
  cv_.SignalAll();
  return absl::InvalidArgumentError(why);
}

absl::Status CoordinatorCore::CheckDuplicate(const PushTicket& ticket) {
  if (config_.outer.aggregation == Aggregation::kMean || config_.outer.mode != OuterMode::kSync || ticket.parts > 1 ||
      !ticket.folded_any || !(ticket.squared_norm > 0)) {
    return absl::OkStatus();  // mean trusts its pushes; a zero push is no work to copy
  }
  std::string original;
  for (const auto& [id, counted] : round_.pushed()) {
    if (counted.payload_hash == ticket.payload_hash) original = absl::StrCat("worker '", id, "''s push of this round");
  }
  if (original.empty() && previous_hashes_.count(ticket.payload_hash) != 0) original = "a push of the previous round";
  if (original.empty()) return absl::OkStatus();
  const std::string why = absl::StrCat("push from worker '", ticket.worker_id, "' for round ", ticket.round + 1,
                                       " is byte-identical to ", original, " (a copy or a replay); push refused");
  // Its chunks are in the sums (or in the window's reduced chunks): start over without it.
  const size_t dropped = DiscardAggregation();
  spdlog::warn("duplicate: {}; restarting the round's aggregation, {} worker(s) push again", why, dropped);
  if (Member* m = membership_.Find(ticket.worker_id)) {
    ++m->duplicate_pushes;
    if (m->quarantined_until_round <= theta_->round()) m->quarantine_reason = "its push was a copy or a replay";
    m->quarantined_until_round = std::max(m->quarantined_until_round, theta_->round() + 1);  // sits out this round
  }
  cv_.SignalAll();
  return absl::FailedPreconditionError(why);
}

void CoordinatorCore::RecordPushNorm(Member& m, const PushTicket& ticket) {
  m.last_push_norm = std::sqrt(ticket.squared_norm);
  m.last_clip_scale = ticket.fold_scale;
}

void CoordinatorCore::NoteClippedPushes(const RoundState::Pushes& contributors, const std::set<std::string>& far_ids) {
  const int64_t flag = config_.outer.flag_rounds;
  const double margin = config_.outer.flag_margin;
  const bool trimmed_mean = config_.outer.aggregation == Aggregation::kTrimmedMean;
  for (const auto& [id, ticket] : contributors) {
    Member* m = membership_.Find(id);
    if (m == nullptr) continue;
    // Half of the honest pushes are clipped a little in any round (clip_factor 1 x the median norm): only a push far
    // beyond the threshold counts.
    const double norm = std::sqrt(ticket.squared_norm);
    const bool far_clipped = FarBeyond(norm, norm * ticket.fold_scale, 0, margin);
    const bool far_other = far_ids.count(id) != 0;  // along the momentum, or under a coordinate-wise rule
    m->clipped_in_a_row = far_clipped || far_other ? m->clipped_in_a_row + 1 : 0;
    const bool suspect = flag > 0 && m->clipped_in_a_row >= flag;
    if (suspect && !m->suspect) {
      std::string limits = CoordinateWiseWithoutNormClip()
                               ? absl::StrCat("lay over ", margin, " x the round's median norm")
                               : absl::StrCat("lay over ", margin, " x the clip threshold");
      if (MomentumWatched())
        absl::StrAppend(&limits, " or ", margin, " x as far along the outer momentum as the bound");
      if (trimmed_mean)
        absl::StrAppend(&limits, " or kept under 1/", margin, " of an even trim's share of its coordinates");
      std::string facts = absl::StrFormat("norm %.4g", m->last_push_norm);
      if (m->last_clip_scale < 1) absl::StrAppendFormat(&facts, ", scaled by %.3g", m->last_clip_scale);
      if (m->momentum_bounded || m->momentum_far)
        absl::StrAppendFormat(&facts, ", cosine %.3g with the momentum", m->momentum_cosine);
      if (trimmed_mean)
        absl::StrAppendFormat(&facts, ", dropped by the trim at %.1f%% of its coordinates",
                              100 * m->last_trimmed_share);
      spdlog::warn("suspect: worker {}'s push {} in {} rounds in a row ({}); diloco-ctl leave removes it", id, limits,
                   m->clipped_in_a_row, facts);
    }
    m->suspect = suspect;
  }
}

}  // namespace diloco
