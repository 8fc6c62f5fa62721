// CoordinatorCore, pushes in parts (coordinator.h, push_parts.h): a worker cluster's member pushes its
// pseudo-gradient as n part streams, one per rank, each covering a range of the round's flat buffer. BeginPart
// admits a part (a refused part breaks the member's whole push), CommitPart counts the member once every part is in.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "proto/peer_text.h"

namespace diloco {

absl::Status CoordinatorCore::BeginPart(const PushHeader& header, PushTicket& ticket) {
  const Member* m = membership_.Find(ticket.worker_id);
  int64_t numel = 0;
  for (const TensorSpec& spec : fragment_specs(ticket.fragment)) numel += spec.numel();
  PartHeader part{ticket.worker_id,
                  header.part(),
                  header.parts(),
                  m != nullptr ? m->cluster_size : 1,
                  {header.range().begin(), header.range().end()},
                  header.meta().round(),
                  header.tokens(),
                  numel,
                  header.attempt()};
  if (round_.IsStreaming(ticket.worker_id)) {
    return absl::UnavailableError(
        absl::StrCat("a push from worker '", ticket.worker_id, "' in one stream is still streaming; retry later"));
  }
  const uint64_t latest = parts_.LatestAttempt(ticket.worker_id);
  switch (parts_.Classify(ticket.worker_id, header.attempt())) {
    case PushParts::AttemptVerdict::kStale:  // read late: the member has moved on, or this attempt was discarded
      return absl::AbortedError(absl::StrCat(
          "push part ", header.part(), " of worker '", ticket.worker_id, "' refused: its attempt ", header.attempt(),
          header.attempt() < latest ? absl::StrCat(" is older than attempt ", latest)
                                    : std::string(" was discarded (a part broke or was refused, or the aggregation "
                                                  "restarted)"),
          "; push every part again under a new attempt"));
    case PushParts::AttemptVerdict::kPushOver:
      // The member pushes over, as when one of its parts broke on the way (perhaps before this coordinator read that
      // part's header, so nothing broke here) and every rank pushes its part again with the same values. The earlier
      // attempt's parts go as a broken push's do (the aggregation restarts if they had chunks in the sums; their
      // streams still open are ABORTED) and this part opens the new attempt.
      DiscardParts(ticket.worker_id,
                   absl::StrCat("attempt ", header.attempt(), " replaces attempt ",
                                parts_.AttemptOf(ticket.worker_id).value_or(0), ": the member pushes over"));
      ticket.epoch = round_.epoch();
      break;
    case PushParts::AttemptVerdict::kJoin:
    case PushParts::AttemptVerdict::kNew:
      break;
  }
  auto generation = parts_.Begin(part, clock_());
  if (!generation.ok()) {
    DiscardParts(ticket.worker_id, std::string(generation.status().message()));
    return generation.status();
  }
  ticket.part = header.part();
  ticket.parts = header.parts();
  ticket.generation = *generation;
  ticket.stream_key = absl::StrCat(ticket.worker_id, "#", header.part());
  return absl::OkStatus();
}

absl::Status CoordinatorCore::CommitPart(PushTicket& ticket) {
  auto whole = parts_.Commit(ticket, ticket.part, clock_());
  if (!whole.ok()) {  // every part came but they leave elements out: the parts in the sums must go
    RestartAggregation(ticket.worker_id, ticket.round, std::string(whole.status().message()),
                       /*cut_as_stalled=*/false);
    return whole.status();
  }
  if (!whole->has_value()) {  // accepted; the member counts when its last part commits
    spdlog::debug("push part {} of {} from {} for round {} in", ticket.part, ticket.parts, ticket.worker_id,
                  ticket.round + 1);
    return absl::OkStatus();
  }
  const std::string id = ticket.worker_id;
  absl::Status counted = CountPush(**whole);
  if (Member* m = membership_.Find(id); counted.ok() && m != nullptr) ++m->pushes_in_parts;
  return counted;
}

absl::Status CoordinatorCore::StalePartRefusal(const PushTicket& ticket) const {
  if (ticket.parts <= 1 || parts_.IsCurrent(ticket.worker_id, ticket.generation)) return absl::OkStatus();
  if (parts_.CutAsStalled(ticket.generation)) return CutRefusal(ticket);
  return absl::AbortedError(absl::StrCat("another part of worker '", ticket.worker_id,
                                         "''s push broke, was refused or was pushed over; push every part again"));
}

void CoordinatorCore::DiscardParts(const std::string& id, const std::string& why) {
  if (parts_.Discard(id)) {
    RestartAggregation(id, theta_->round(), why, /*cut_as_stalled=*/false);
  } else {
    spdlog::warn("push in parts from {} for round {} broken ({}); none of its parts was in the sums", id,
                 theta_->round() + 1, Truncated(why, 512));
  }
}

}  // namespace diloco
