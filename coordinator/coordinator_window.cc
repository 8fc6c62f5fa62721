// CoordinatorCore, the coordinate-wise rules (outer.aggregation trimmed_mean and centered_clip, sync rounds): the
// round's set of pushes is fixed from their headers, then each chunk goes through the CoordinateWindow
// (coordinate_window.h), which hands back every chunk reduced once all pushes of the set sent it; the reduced chunk is
// written into the round accumulator, and the set's pushes count 1/k each, so the round's "average" is the rule's
// result. A push that runs window_chunks ahead of the slowest waits here (its ingest thread blocks, gRPC flow control
// holds the sender back). At the close, each push's trimmed share and the far-out test of the suspect flag
// (NoteCoordinateWiseFar). docs/operations.md "Robust aggregation".
#include <spdlog/spdlog.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"

namespace diloco {

int CoordinatorCore::ingest_threads() const { return IngestThreadsFor(config_); }

bool CoordinatorCore::CoordinateWiseRounds() const {
  return IsCoordinateWise(config_.outer.aggregation) && config_.outer.mode == OuterMode::kSync;
}

absl::Status CoordinatorCore::AdmitToWindow(const PushHeader& header, PushTicket& ticket) {
  const std::string& id = header.meta().worker_id();
  const bool norm_clip = config_.outer.aggregation == Aggregation::kCenteredClip && config_.outer.cclip_norm_clip;
  if (norm_clip) {  // centered_clip's inputs bounded first, as clip bounds its pushes (ClipGate)
    const double norm = header.claimed_norm();
    if (!std::isfinite(norm) || norm <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("push header: claimed_norm (", norm, ") must be finite and > 0 with outer.cclip_norm_clip"));
    }
    clip_gate_.Declare(id, norm, static_cast<double>(header.tokens()));
  }
  if (!window_.open()) {
    window_.Declare(id);
    const std::vector<std::string> expected = UnquarantinedActiveIds();
    const bool force = ForceSetNow();
    if (!window_.TryOpen(expected, force, HeadersNeeded(force, expected.size()))) {
      return absl::UnavailableError(absl::StrCat("outer.aggregation ", std::string(EnumName(config_.outer.aggregation)),
                                                 ": waiting for the round's other push headers (", window_.declared(),
                                                 " of ", expected.size(), " declared); retry"));
    }
    window_.Touch(clock_());
    spdlog::info("round {}: {} aggregation of {} pushes open, {} chunks per push in the window", theta_->round() + 1,
                 EnumName(config_.outer.aggregation), window_.size(), config_.outer.window_chunks);
    const auto k = static_cast<int64_t>(window_.size());
    if (config_.outer.aggregation == Aggregation::kTrimmedMean && k < 2 * config_.outer.trim + 1) {
      spdlog::warn(
          "round {}: the set holds {} pushes, fewer than 2 x outer.trim + 1 = {}: each end is trimmed by {} only "
          "(docs/operations.md \"Which pushes are in the set\")",
          theta_->round() + 1, k, 2 * config_.outer.trim + 1, (k - 1) / 2);
    }
  }
  if (!window_.Holds(id)) {
    return absl::UnavailableError(absl::StrCat("outer.aggregation ", std::string(EnumName(config_.outer.aggregation)),
                                               ": round ", theta_->round() + 1, "'s set of ", window_.size(),
                                               " pushes is fixed without worker '", id,
                                               "'; retry (the round closes without it)"));
  }
  ticket.weight = 1.0 / static_cast<double>(window_.size());
  ticket.momentum = axis_;  // outer.momentum_bound: its projection is judged (the flag), not bounded
  if (norm_clip) {
    clip_gate_.TryOpen({}, /*force=*/true, 1);  // the medians of the headers declared when the set was fixed
    ticket.claimed_norm = header.claimed_norm();
    ticket.fold_scale = clip_gate_.Scale(ticket.claimed_norm);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorCore::FoldToWindow(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values) {
  while (!window_.HasRoom(ticket.worker_id)) {  // the round loop cuts the slowest after lease_s (CheckWindowStall)
    if (!window_.Holds(ticket.worker_id)) return absl::AbortedError("the round's aggregation restarted; push again");
    round_.MarkFolded(ticket.stream_key, clock_());  // waiting for the slowest push is progress
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    if (stop_) return absl::UnavailableError("the coordinator is stopping");
    if (absl::Status s = AdmitFold(ticket); !s.ok()) return s;
  }
  auto done =
      window_.Put(ticket.worker_id, index, offset, ticket.fold_scale == 1 ? values : values * ticket.fold_scale);
  if (!done.ok()) return done.status();
  if (done->has_value()) {
    accumulator_.Fold((*done)->index, (*done)->offset, (*done)->values, 1.0);
    window_.Touch(clock_());
    cv_.SignalAll();  // the pushes waiting for room
  }
  return absl::OkStatus();
}

bool CoordinatorCore::CoordinateWiseWithoutNormClip() const {
  return CoordinateWiseRounds() &&
         !(config_.outer.aggregation == Aggregation::kCenteredClip && config_.outer.cclip_norm_clip);
}

std::set<std::string> CoordinatorCore::NoteCoordinateWiseFar(const RoundState::Pushes& contributors) {
  std::set<std::string> far_ids;
  if (!CoordinateWiseRounds() || contributors.empty()) return far_ids;
  const double margin = config_.outer.flag_margin;
  std::vector<double> norms;
  for (const auto& [id, ticket] : contributors) norms.push_back(std::sqrt(ticket.squared_norm));
  const double median_norm = Median(norms);
  const bool trimmed_mean = config_.outer.aggregation == Aggregation::kTrimmedMean;
  const auto k = static_cast<int64_t>(window_.size());
  for (const auto& [id, ticket] : contributors) {
    const double share = trimmed_mean ? window_.TrimmedShare(id) : 0;
    if (Member* m = membership_.Find(id)) m->last_trimmed_share = share;
    const bool far_trimmed = trimmed_mean && FarBeyond(1.0, TrimKeptScale(share, config_.outer.trim, k), 0, margin);
    // Without a norm clip nothing scaled the push: its norm against the round's median, as clip's test.
    const bool far_norm =
        CoordinateWiseWithoutNormClip() && FarBeyond(std::sqrt(ticket.squared_norm), median_norm, 0, margin);
    if (far_trimmed || far_norm) far_ids.insert(id);
  }
  return far_ids;
}

void CoordinatorCore::CheckWindowStall(double now) {
  if (!CoordinateWiseRounds() || !window_.open() || window_.complete()) return;
  for (const std::string& id : window_.Unfinished()) {
    if (membership_.IsActive(id)) continue;
    RestartAggregation(id, theta_->round(), "the member was lost or left before its push finished",
                       /*cut_as_stalled=*/false);
    return;
  }
  if (now - window_.progress_at() > config_.coordinator.lease_s) CutWindowLaggards();
}

void CoordinatorCore::CutWindowLaggards() {
  for (const std::string& id : window_.Laggards()) {
    spdlog::warn(
        "push from {} for round {} cut as late: the {} aggregation waited coordinator.lease_s {} s for its next "
        "chunk",
        id, theta_->round() + 1, EnumName(config_.outer.aggregation), config_.coordinator.lease_s);
    round_.CutStream(id);
    RecordBrokenPush(id, /*cut_as_stalled=*/true);
  }
  const size_t dropped = DiscardAggregation();
  spdlog::warn("round {}: restarting the aggregation after a stalled push was cut; {} worker(s) push again",
               theta_->round() + 1, dropped);
  cv_.SignalAll();
}

}  // namespace diloco
