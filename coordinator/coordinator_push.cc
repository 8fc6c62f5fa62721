// CoordinatorCore, the push path (coordinator.h): BeginPush admits a push, FoldChunk adds its chunks to the round's
// sums, CommitPush counts it, AbortPush undoes a push that broke off. The rules for which round a push may be for
// are round_policy.h's DecidePushRound; the bookkeeping is round_state.h's.
#include <spdlog/spdlog.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"

namespace diloco {

absl::Status CoordinatorCore::CheckPushHeader(const PushHeader& header) {
  const std::string& id = header.meta().worker_id();
  if (const Member* m = membership_.Find(id); m != nullptr && clock_() - m->last_seen > config_.coordinator.lease_s) {
    // Silent past its lease (the round loop marks it lost at its next pass): it must join again before it counts.
    return absl::NotFoundError(absl::StrCat("worker '", id, "' lease expired (silent for ", clock_() - m->last_seen,
                                            " s > coordinator.lease_s ", config_.coordinator.lease_s, "); Join again"));
  }
  if (complete_) return absl::FailedPreconditionError("the run is complete");
  absl::Status s = DecidePushRound({snapshot_->round, header.meta().round(), round_.phase()},
                                   {async(), config_.outer.max_staleness});
  if (!s.ok()) return s;
  if (round_.HasPushed(id)) {
    return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' already pushed for round ", snapshot_->round));
  }
  if (round_.IsStreaming(id)) {  // e.g. a retry while the first stream is still open: never count a worker twice
    return absl::UnavailableError(
        absl::StrCat("a push from worker '", id, "' for round ", snapshot_->round, " is still streaming; retry later"));
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
  const int fragment = static_cast<int>(snapshot_->round % fragments());
  if (header.fragment() != fragment) {
    return absl::InvalidArgumentError(absl::StrCat("push of fragment ", header.fragment(), " refused: round ",
                                                   snapshot_->round + 1, " syncs fragment ", fragment, " of ",
                                                   fragments()));
  }
  return absl::OkStatus();
}

absl::StatusOr<PushTicket> CoordinatorCore::BeginPush(const PushHeader& header) {
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckMeta(header.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  s = CheckPushHeader(header);
  if (!s.ok()) return s;
  const std::string& id = header.meta().worker_id();
  membership_.Touch(id, clock_());
  round_.StartStream(id);
  PushTicket t;
  t.worker_id = id;
  t.round = snapshot_->round;
  t.fragment = static_cast<int>(snapshot_->round % fragments());
  t.epoch = round_.epoch();
  t.weight = static_cast<double>(header.tokens());
  t.tokens = header.tokens();
  t.inner_steps = header.inner_steps();
  t.loss = header.loss();
  t.seconds = header.seconds();
  t.data_epochs = header.data_epochs();
  return t;
}

absl::Status CoordinatorCore::FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                                        int64_t wire_bytes) {
  if (wire_bytes < 0) wire_bytes = values.numel() * values.element_size();
  if (index >= specs_.size() || offset < 0 || offset + values.numel() > specs_[index].numel()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk outside the model: tensor ", index, " elements [", offset,
                                                   ", ", offset + values.numel(), ")"));
  }
  if (!AllFinite(values)) {
    return absl::InvalidArgumentError(absl::StrCat("pseudo-gradient of '", specs_[index].name,
                                                   "' holds NaN or Inf near element ", offset, "; push refused"));
  }
  absl::MutexLock lock(&mu_);
  if (ticket.round != snapshot_->round || round_.phase() != RoundPhase::kTraining) {
    return absl::FailedPreconditionError(absl::StrCat("round ", ticket.round, " closed while the push was streaming"));
  }
  if (ticket.epoch != round_.epoch()) {
    return absl::AbortedError("the round's aggregation restarted after a broken push; push again");
  }
  accumulator_.Fold(index, offset, values, ticket.weight);
  ticket.folded_any = true;
  round_.MarkFolded(ticket.worker_id);
  ticket.bytes += wire_bytes;
  stats_.bytes_received += wire_bytes;
  return absl::OkStatus();
}

absl::Status CoordinatorCore::CommitPush(PushTicket& ticket) {
  absl::MutexLock lock(&mu_);
  if (!ticket.finished) round_.EndStream(ticket.worker_id);
  ticket.finished = true;
  if (ticket.round != snapshot_->round || round_.phase() != RoundPhase::kTraining) {
    return absl::FailedPreconditionError(absl::StrCat("round ", ticket.round, " closed before the push completed"));
  }
  if (ticket.epoch != round_.epoch()) return absl::AbortedError("the round's aggregation restarted; push again");
  accumulator_.AddContribution(ticket.weight);
  round_.Count(ticket);
  if (Member* m = membership_.Find(ticket.worker_id)) {
    m->last_loss = ticket.loss;
    m->last_tokens_per_s = ticket.seconds > 0 ? ticket.tokens / ticket.seconds : 0;
    m->data_epochs = ticket.data_epochs;
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

void CoordinatorCore::AbortPush(PushTicket& ticket, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (ticket.finished) return;
  ticket.finished = true;
  round_.EndStream(ticket.worker_id);
  if (!ticket.folded_any || ticket.epoch != round_.epoch() || ticket.round != snapshot_->round) return;
  // Some of this push is in the sums and the rest never came: discard the round's aggregation so far.
  accumulator_.Reset();
  const size_t dropped = round_.RestartAggregation();
  spdlog::warn("push from {} for round {} broke off ({}); restarting the round's aggregation, {} worker(s) push again",
               ticket.worker_id, ticket.round, why, dropped);
}

}  // namespace diloco
