// RunWorker: the life of one worker process. Join the coordinator (retrying with exponential backoff and jitter
// until workers.connect_timeout_s), then per round: pull theta_t, train H inner steps on its shard, push the
// pseudo-gradient, and wait (heartbeating) until the coordinator publishes theta_{t+1}; push again if the round's
// aggregation restarted; re-join if the coordinator forgot it. Ends when the coordinator says the run is complete
// (exit 0; a heartbeat that says so while it trains abandons the round), when an operator drains it (diloco-ctl
// leave: abandons its round, Leave, exit 0), on SIGINT/SIGTERM (abandons its round, Leave, exit 0), or on a refusal
// it cannot fix (exit 3) or no coordinator (exit 4): the exit codes of worker/worker_options.h, carried by the
// returned status (OK: exit 0), which diloco-worker's main prints.
// After a late (refused) push, outer.late_policy reuse_local keeps its own parameters for the next round.
// A heartbeat thread keeps the lease alive while it trains. With workers.cluster_size > 1 the process of rank 0 does
// all that and drives the other ranks (worker/cluster_protocol.h), which train (and, with
// comm.cluster_parts, push and pull their slices: worker/part_exchange.h). The loop itself is Worker
// (worker/worker.h); its decisions on each gRPC status are worker/protocol_decision.h's.
// Thread-safety: call once per process.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "worker/worker_options.h"

namespace diloco {

// `stop` is set by the signal handler; the worker leaves at its next check.
absl::Status RunWorker(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                       const std::atomic<bool>& stop);

}  // namespace diloco
