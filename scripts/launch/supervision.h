// Supervision: when diloco-launch ends a run by itself, and with which exit code. A pure function of what the launcher
// knows about its children (which run, which exited with what code and when, the last error line each printed), the
// signal it received, a clock reading and the options; it returns the decision and the reason (docs/development.md
// "Pure decisions", like the round policy). The clock is injected. In order:
//   a signal (SIGINT, SIGTERM)                    -> stop every child; exit 130;
//   a worker exited with a configuration error    -> stop every child; exit 2 with the first such worker's error line
//     (its code 2: a key, a file or a device it cannot use; the same error would stop every worker it starts);
//   a worker refused by the coordinator, the workers still running fewer than coordinator.min_workers, and no other
//   worker exited 0 since (the run completing, or a drain)
//                                                 -> stop every child; exit 2 with its error line (its code 3: its
//     config differs from the coordinator's, or a token or certificate is wrong; no round could close without it,
//     and nothing restarts it). With enough workers left, it is elastic membership like any worker that leaves;
//   the coordinator exited                        -> the run ended: once every worker has exited, or after
//     worker_grace_s (workers see the end of the run at their next heartbeat); exit 0 if every child exited 0;
//   every worker exited, the coordinator runs     -> the run has rounds left and no one to train them: stop; exit 3.
//     At once if a worker failed (a non-zero exit, e.g. killed); if all exited 0 (they saw the run complete, or were
//     drained by diloco-ctl leave), only after completion_grace_s, which a completing coordinator needs to let the
//     workers leave and write its summary before it exits by itself;
//   otherwise                                     -> wait: a worker that leaves or fails while others go on is elastic
//     membership (it may rejoin, or the run goes on without it).
// The launcher's exit codes come from the status of the decision (ExitCodeOf): 0 run complete, 1 a child failed or
// could not start, 2 a configuration error (the launcher's own check or a worker's), 3 every worker exited with rounds
// left, 130 a signal. Thread-safe (no state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace diloco {

// diloco-worker's exit code for a configuration error at start-up (WorkerExit kWorkerConfigError).
inline constexpr int kWorkerConfigErrorExit = 2;
// ... when the coordinator refused it (WorkerExit kWorkerRefused).
inline constexpr int kWorkerRefusedExit = 3;

// One child process as the supervisor sees it.
struct ChildView {
  std::string name;        // "coordinator", "worker-1", "worker-1.0" (rank 0 of worker-1's cluster)
  bool running = true;     // false once it has exited (and was reaped)
  int exit_code = 0;       // once exited: its code, 128 + N if signal N ended it
  double exited_at = 0;    // once exited: when, in seconds on the clock of `now`
  std::string error_line;  // the message of the last error line it printed (ErrorMessageOf), or ""
};

struct SupervisionView {
  int signal = 0;  // the signal the launcher received, 0 if none
  ChildView coordinator;
  std::vector<ChildView> workers;  // every worker process started, in start order
};

struct SupervisionOptions {
  double worker_grace_s = 30;      // after the coordinator exited: how long the workers still running get to exit
  double completion_grace_s = 30;  // after every worker exited 0: how long the coordinator gets to exit by itself
  int min_workers = 1;             // coordinator.min_workers: pushes a round needs before it can close
};

enum class SupervisionAction {
  kWait,  // keep supervising
  kEnd,   // the run ended: stop the children still running, reap them; exit 0 if every child exited 0, else 1
  kStop,  // end the launch now: stop every child (workers first, then the coordinator), reap them; exit with status
};

struct SupervisionDecision {
  SupervisionAction action = SupervisionAction::kWait;
  absl::Status status;  // kStop: why, as the one fatal line (its code picks the exit code); OK otherwise
  std::string reason;   // what the launcher prints when the decision changes
};

SupervisionDecision DecideSupervision(const SupervisionView& view, double now, const SupervisionOptions& options);

// The launcher's exit code for how the launch ended: OK 0; CANCELLED 130 (a signal); UNAVAILABLE 3 (every worker
// exited with rounds left); ABORTED 1 (a child could not start); any other code 2 (the configuration, a file, the token
// data, a worker's configuration error: what the user fixes before launching again).
int ExitCodeOf(const absl::Status& status);

// The message of an error line a child printed, "" if it is not one: a log line "HH:MM:SS.mmm error NAME: MESSAGE" (or
// critical) gives MESSAGE, "diloco-worker: [error: ]MESSAGE" gives MESSAGE.
std::string ErrorMessageOf(const std::string& line);

}  // namespace diloco
