// RunClusterFollower: the life of a rank > 0 of a worker cluster (workers.cluster_size > 1). It never talks to the
// coordinator: it waits for the leader's commands (worker/cluster.h) — load theta, train n steps (gradients averaged
// with the other ranks every step), merge a fragment, stop — and exits 0 on stop, 5 (kWorkerClusterFailed) when the
// leader or another rank died. Thread-safety: call once per process.
#pragma once

#include <atomic>

#include "config/config.h"
#include "config/data_cache.h"
#include "worker/cluster.h"
#include "worker/worker_loop.h"

namespace diloco {

int RunClusterFollower(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                       WorkerCluster& cluster, const std::atomic<bool>& stop);

}  // namespace diloco
