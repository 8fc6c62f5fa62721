// HeldHeartbeats: the heartbeats that workers asked the coordinator to hold (HeartbeatRequest.wait_ms, PROTOCOL.md
// "Waiting for the round to close") while their answer would be "round t, your push is counted". Each is answered
// as soon as that answer changes (the round closed, the push must be made again, the run completed, the worker was
// asked to leave or quarantined) or at its deadline, with the answer of that moment. So a worker that has pushed
// learns of the close within one round-loop wake-up instead of one poll interval.
// Owns the held answers' callbacks; holds at most one per worker (a newer heartbeat of the same worker has the
// older answered at once). Pure bookkeeping, no clock and no threads of its own: the caller passes the time and the
// current answer. Not thread-safe: CoordinatorCore keeps it under its mutex and runs the callbacks it hands back
// after unlocking.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"
#include "proto/heartbeat_wait.h"

namespace diloco {

// Whether a heartbeat answer may be held for a worker that is waiting for round `round` to close: the answer says
// that round is still open, the worker's push for it is counted, and the run goes on with this worker in it.
// async (outer.mode async): `round` is the version the push was computed against, which may be older than the one
// open; held while the push is pending (its answer changes when it is applied or discarded).
bool Holdable(const HeartbeatReply& reply, int64_t round, bool async);

class HeldHeartbeats {
 public:
  using Answer = std::function<void(absl::StatusOr<HeartbeatReply>)>;
  struct Held {
    std::string worker_id;
    double deadline = 0;   // seconds, on the caller's clock
    HeartbeatReply reply;  // the answer when it was held; Due replaces it with the answer to send
    Answer answer;
  };

  // Holds `held`. Returns the heartbeat of the same worker it replaces, if any: answer it now.
  std::optional<Held> Hold(Held held);
  // Takes out and returns those whose answer changed (current(worker_id) differs from the held one in round,
  // pushed, run_complete, drain or quarantine) or whose deadline has passed by `now`; all of them with `all`. Each
  // returned Held carries current(worker_id) as the reply to send.
  std::vector<Held> Due(double now, const std::function<HeartbeatReply(const std::string&)>& current, bool all);
  size_t size() const { return held_.size(); }

 private:
  std::vector<Held> held_;
};

}  // namespace diloco
