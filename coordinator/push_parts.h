// PushParts: the members of the open round whose push comes in parts (a worker cluster: one part per rank, each on
// its own stream; proto/PROTOCOL.md "Push and pull in parts"). Each part is a push stream of its own (a PushTicket);
// this class keeps, per member, which parts began and which committed, and says when the member's push is complete:
// every part committed and the parts' ranges cover the round's flat buffer exactly once. Only then does the core
// count the member (one contribution, its tokens once). A part refused or broken discards the member's assembly
// (Discard); the core restarts the round's aggregation when any part of it had chunks in the sums, so a member is
// never partly in a round and nothing is applied twice. Part tickets carry the assembly's generation: a part of a
// discarded assembly is stale (IsCurrent false) and is refused when it next folds or commits. Parts carry the
// member's attempt (PushHeader.attempt, PROTOCOL.md "Pushing over"): the newest attempt seen in the open round is
// kept across discards, so a part of an attempt already replaced or discarded never opens an assembly again.
// Not thread-safe: a plain value that CoordinatorCore guards with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/round_state.h"
#include "proto/slice_plan.h"

namespace diloco {

// A part's header, as CoordinatorCore::BeginPush read it.
struct PartHeader {
  std::string member;      // worker id
  int part = 0;            // 0-based
  int parts = 0;           // > 1
  int declared = 1;        // the member's cluster_size at Join: parts must equal it
  FlatRange range;         // elements of the round's flat buffer this part covers
  int64_t push_round = 0;  // meta.round: the round its pseudo-gradient was computed against
  int64_t tokens = 0;
  int64_t numel = 0;     // elements of the round's flat buffer (the fragment's tensors)
  uint64_t attempt = 0;  // PushHeader.attempt
};

class PushParts {
 public:
  // Checks a part against the member's assembly (started by its first part) and records it as begun; returns the
  // generation to keep in its ticket. INVALID_ARGUMENT: part >= parts, a range outside the buffer or overlapping a
  // part already begun, tokens differing from its first part's; FAILED_PRECONDITION: parts not the member's declared
  // cluster_size, a part already begun, parts of two different rounds or attempts (the core starts the member's push
  // over, or refuses a stale part, before that). A refusal leaves the assembly as it was (the caller discards it: a
  // refused part breaks the member's push).
  absl::StatusOr<int64_t> Begin(const PartHeader& header, double now);
  // Whether the ticket's part belongs to the member's live assembly.
  bool IsCurrent(const std::string& member, int64_t generation) const;
  void MarkFolded(const std::string& member, double now);  // a chunk of one of its parts reached the sums
  // A part's stream ended complete. Returns the member's whole push when this was its last part (the header values
  // of its first committed part; bytes, squared norms and momentum dots summed over the parts, their payload hashes
  // chained in part order), else nullopt. FAILED_PRECONDITION when every part is in but their
  // ranges leave elements out (the assembly is then discarded).
  absl::StatusOr<std::optional<PushTicket>> Commit(const PushTicket& part_ticket, int part, double now);
  // What a part of `attempt` is to the member's push (attempt 0, a client without attempts: kJoin or kNew).
  enum class AttemptVerdict {
    kJoin,      // a part of the assembly under way
    kNew,       // opens the member's first assembly of this attempt
    kPushOver,  // newer than the assembly under way: discard that one (Discard), then Begin
    kStale,     // not newer than an attempt already replaced or discarded: refuse, open nothing
  };
  AttemptVerdict Classify(const std::string& member, uint64_t attempt) const;
  // The newest attempt of the member's parts seen this round (0 if none).
  uint64_t LatestAttempt(const std::string& member) const;
  // The attempt of the member's assembly under way, if any.
  std::optional<uint64_t> AttemptOf(const std::string& member) const;
  // Whether the member has an assembly with chunks in the sums (folded or committed parts).
  bool HasFolded(const std::string& member) const;
  // Drops the member's assembly (its push broke; `stalled`: cut as late, see CutAsStalled); returns whether it had
  // chunks in the sums.
  bool Discard(const std::string& member, bool stalled = false);
  // Whether the assembly `generation` was cut as stalled (its streams are told "cut as late", not ABORTED).
  bool CutAsStalled(int64_t generation) const { return stalled_.count(generation) != 0; }
  void Clear() { members_.clear(); }  // the aggregation restarted: the attempts seen stay
  void NewRound();                    // the round closed: assemblies, attempts and stalled generations go
  // The member joined again (its process restarted): its attempts go. Its assembly must be discarded first (Discard).
  void Forget(const std::string& member);
  // Assemblies with chunks in the sums: a round may not close under them.
  size_t partial_count() const;
  // Members whose assembly made no progress for stall_s or is older than max_age_s.
  std::vector<std::string> Stalled(double now, double stall_s, double max_age_s) const;
  // Parts committed so far and parts of the member's push under way; {0, 0} when none.
  std::pair<int, int> Progress(const std::string& member) const;

 private:
  struct Assembly {
    int64_t generation = 0;
    int parts = 0;
    int64_t push_round = 0;
    int64_t tokens = 0;
    int64_t numel = 0;
    uint64_t attempt = 0;
    std::map<int, FlatRange> begun;       // by part
    std::map<int, PushTicket> committed;  // part -> its ticket (bytes, squared norm, momentum dot, payload hash)
    PushTicket first;                     // the first committed part's ticket: the member's header values
    bool folded = false;
    double opened_at = 0;
    double progress_at = 0;
  };
  std::map<std::string, Assembly> members_;
  std::map<std::string, uint64_t> latest_attempt_;  // per member, this round
  std::set<int64_t> stalled_;                       // generations cut as stalled, this round
  int64_t next_generation_ = 0;
};

}  // namespace diloco
