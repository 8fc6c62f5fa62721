// WorkerOptions: what diloco-worker's command line adds to the config (the coordinator, the worker id, the rank of a
// worker cluster). WorkerExit: the process's exit codes. A fatal error travels up as an absl::Status that carries the
// exit code it means (WorkerError / WithExitCode attach it, ExitCodeOf reads it back), so that diloco-worker's main is
// the one place that prints a fatal error (one line) and picks the exit code.
// Every part of the worker reads these (the worker loop, the protocol decisions, the cluster's ranks, the data-parallel
// baseline). Plain data and pure functions: thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace diloco {

struct WorkerOptions {
  std::string coordinator;  // HOST:PORT
  std::string id;
  int rank = 0;               // workers.cluster_size > 1: this process's rank in its worker's cluster
  std::string cluster_store;  // ... and HOST:PORT of the cluster's c10d store (hosted by rank 0)
  std::string cluster_bind;   // this rank's own address for Gloo (default: the store's host)
  std::string attack;         // TEST-ONLY (--attack): push a wrong pseudo-gradient, worker/attack.h
  std::string dump_delta;     // TEST-ONLY (--dump-delta): write each pushed pseudo-gradient there (attack copy:PATH)
};

// kWorkerFailed: an error while training (a device error such as out of memory, a training that turns non-finite
// round after round from the global model); the worker left the run.
// kWorkerClusterFailed: a rank of this worker's cluster died or a collective failed; the cluster left the run.
enum WorkerExit {
  kWorkerDone = 0,
  kWorkerFailed = 1,
  kWorkerConfigError = 2,
  kWorkerRefused = 3,
  kWorkerUnreachable = 4,
  kWorkerClusterFailed = 5,
  kWorkerInterrupted = 130  // a signal came before the worker could join
};

// A fatal error whose message is the line to print and whose exit code is `code`.
absl::Status WorkerError(WorkerExit code, const std::string& message);
// `status` (not OK) with the exit code `code` attached; an OK status stays OK.
absl::Status WithExitCode(absl::Status status, WorkerExit code);
// kWorkerDone for OK; the attached code; kWorkerConfigError for an error without one (a start-up step's error: a bad
// key, a missing file).
WorkerExit ExitCodeOf(const absl::Status& status);

}  // namespace diloco
