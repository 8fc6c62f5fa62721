// PushParts (push_parts.h): the assemblies of the pushes in parts of the open round.
#include "coordinator/push_parts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/aggregation_rule.h"

namespace diloco {
namespace {

std::string RangeText(const FlatRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

}  // namespace

absl::StatusOr<int64_t> PushParts::Begin(const PartHeader& h, double now) {
  if (h.parts != h.declared) {
    return absl::InvalidArgumentError(absl::StrCat("push part ", h.part, " of ", h.parts, " from worker '", h.member,
                                                   "' refused: it joined with cluster_size ", h.declared,
                                                   ", so its push has ", h.declared, " part(s)"));
  }
  if (h.part < 0 || h.part >= h.parts) {
    return absl::InvalidArgumentError(absl::StrCat("push part ", h.part, " refused: worker '", h.member, "' pushes ",
                                                   h.parts, " parts (0 to ", h.parts - 1, ")"));
  }
  if (h.range.begin < 0 || h.range.end < h.range.begin || h.range.end > h.numel) {
    return absl::InvalidArgumentError(absl::StrCat("push part ", h.part, " refused: range ", RangeText(h.range),
                                                   " is not within the round's ", h.numel, " elements"));
  }
  auto it = members_.find(h.member);
  if (it != members_.end()) {
    const Assembly& a = it->second;
    if (h.push_round != a.push_round) {
      return absl::FailedPreconditionError(absl::StrCat("push part ", h.part, " for round ", h.push_round,
                                                        " refused: worker '", h.member, "' has parts for round ",
                                                        a.push_round, " under way; all parts push the same round"));
    }
    if (h.attempt != a.attempt) {
      return absl::FailedPreconditionError(absl::StrCat("push part ", h.part, " of attempt ", h.attempt,
                                                        " refused: worker '", h.member, "' has attempt ", a.attempt,
                                                        " under way; all parts of an attempt carry the same one"));
    }
    if (a.begun.count(h.part) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("push part ", h.part, " of worker '", h.member,
                                                        "' refused: that part was already pushed this round"));
    }
    if (h.tokens != a.tokens) {
      return absl::InvalidArgumentError(absl::StrCat("push part ", h.part, " refused: tokens ", h.tokens,
                                                     " differ from its other parts' ", a.tokens));
    }
    for (const auto& [part, range] : a.begun) {
      if (h.range.size() > 0 && range.size() > 0 && h.range.begin < range.end && range.begin < h.range.end) {
        return absl::InvalidArgumentError(absl::StrCat("push part ", h.part, " refused: range ", RangeText(h.range),
                                                       " overlaps part ", part, "'s ", RangeText(range)));
      }
    }
  } else {
    Assembly a;
    a.generation = ++next_generation_;
    a.parts = h.parts;
    a.push_round = h.push_round;
    a.tokens = h.tokens;
    a.numel = h.numel;
    a.attempt = h.attempt;
    latest_attempt_[h.member] = std::max(LatestAttempt(h.member), h.attempt);
    a.opened_at = now;
    a.progress_at = now;
    it = members_.emplace(h.member, std::move(a)).first;
  }
  it->second.begun[h.part] = h.range;
  it->second.progress_at = now;
  return it->second.generation;
}

bool PushParts::IsCurrent(const std::string& member, int64_t generation) const {
  auto it = members_.find(member);
  return it != members_.end() && it->second.generation == generation;
}

void PushParts::MarkFolded(const std::string& member, double now) {
  auto it = members_.find(member);
  if (it == members_.end()) return;
  it->second.folded = true;
  it->second.progress_at = now;
}

absl::StatusOr<std::optional<PushTicket>> PushParts::Commit(const PushTicket& part_ticket, int part, double now) {
  auto it = members_.find(part_ticket.worker_id);
  if (it == members_.end()) return absl::AbortedError("push part of a discarded push; push every part again");
  Assembly& a = it->second;
  if (a.committed.empty()) a.first = part_ticket;
  a.committed[part] = part_ticket;
  a.progress_at = now;
  if (static_cast<int>(a.committed.size()) < a.parts) return std::optional<PushTicket>();
  int64_t covered = 0;
  for (const auto& [p, range] : a.begun) covered += range.size();
  if (covered != a.numel) {
    const std::string member = it->first;
    members_.erase(it);
    return absl::FailedPreconditionError(absl::StrCat("push of worker '", member, "' refused: its parts cover ",
                                                      covered, " of the round's ", a.numel,
                                                      " elements; the rest is missing"));
  }
  // The member's push is the parts together: bytes, squared norms and momentum dots add up (the parts are disjoint);
  // its payload hash chains the parts' in part order (the same whatever order they committed in).
  PushTicket whole = a.first;
  whole.bytes = 0;
  whole.squared_norm = 0;
  whole.momentum_dot = 0;
  whole.payload_hash = 0;
  for (const auto& [p, t] : a.committed) {
    whole.bytes += t.bytes;
    whole.squared_norm += t.squared_norm;
    whole.momentum_dot += t.momentum_dot;
    whole.payload_hash = ChainHash(whole.payload_hash, t.payload_hash);
  }
  members_.erase(it);
  return std::optional<PushTicket>(std::move(whole));
}

PushParts::AttemptVerdict PushParts::Classify(const std::string& member, uint64_t attempt) const {
  auto it = members_.find(member);
  if (attempt == 0) return it != members_.end() ? AttemptVerdict::kJoin : AttemptVerdict::kNew;
  if (it != members_.end()) {
    if (attempt == it->second.attempt) return AttemptVerdict::kJoin;
    return attempt > it->second.attempt ? AttemptVerdict::kPushOver : AttemptVerdict::kStale;
  }
  return attempt > LatestAttempt(member) ? AttemptVerdict::kNew : AttemptVerdict::kStale;
}

uint64_t PushParts::LatestAttempt(const std::string& member) const {
  auto it = latest_attempt_.find(member);
  return it == latest_attempt_.end() ? 0 : it->second;
}

void PushParts::NewRound() {
  members_.clear();
  latest_attempt_.clear();
  stalled_.clear();
}

void PushParts::Forget(const std::string& member) { latest_attempt_.erase(member); }

std::optional<uint64_t> PushParts::AttemptOf(const std::string& member) const {
  auto it = members_.find(member);
  if (it == members_.end()) return std::nullopt;
  return it->second.attempt;
}

bool PushParts::HasFolded(const std::string& member) const {
  auto it = members_.find(member);
  return it != members_.end() && (it->second.folded || !it->second.committed.empty());
}

bool PushParts::Discard(const std::string& member, bool stalled) {
  auto it = members_.find(member);
  if (it == members_.end()) return false;
  const bool folded = HasFolded(member);
  if (stalled) stalled_.insert(it->second.generation);
  members_.erase(it);
  return folded;
}

size_t PushParts::partial_count() const {
  size_t n = 0;
  for (const auto& [id, a] : members_) n += a.folded || !a.committed.empty() ? 1 : 0;
  return n;
}

std::vector<std::string> PushParts::Stalled(double now, double stall_s, double max_age_s) const {
  std::vector<std::string> stalled;
  for (const auto& [id, a] : members_) {
    if (now - a.progress_at > stall_s || now - a.opened_at > max_age_s) stalled.push_back(id);
  }
  return stalled;
}

std::pair<int, int> PushParts::Progress(const std::string& member) const {
  auto it = members_.find(member);
  if (it == members_.end()) return {0, 0};
  return {static_cast<int>(it->second.committed.size()), it->second.parts};
}

}  // namespace diloco
