// RunWorker (worker/worker_loop.h): connects a worker cluster if there is one, then runs the leader's Worker
// (worker/worker.h) or a follower (worker/cluster_protocol.h).
#include "worker/worker_loop.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "worker/cluster.h"
#include "worker/cluster_protocol.h"
#include "worker/part_exchange.h"
#include "worker/worker.h"

namespace diloco {

absl::Status RunWorker(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                       const std::atomic<bool>& stop) {
  std::unique_ptr<WorkerCluster> cluster;
  if (config.workers.cluster_size > 1) {
    if (options.cluster_store.empty()) {
      return WorkerError(kWorkerConfigError, absl::StrCat("workers.cluster_size is ", config.workers.cluster_size,
                                                          ": pass --rank and --cluster-store HOST:PORT (rank 0 hosts "
                                                          "the store)"));
    }
    if (options.rank < 0 || options.rank >= config.workers.cluster_size) {
      return WorkerError(kWorkerConfigError,
                         absl::StrCat("--rank ", options.rank,
                                      ": must be in [0, workers.cluster_size = ", config.workers.cluster_size, ")"));
    }
    auto connected = WorkerCluster::Connect(options.rank, static_cast<int>(config.workers.cluster_size),
                                            options.cluster_store, config.workers.cluster_timeout_s,
                                            options.cluster_bind, torch::Device(config.workers.device));
    if (!connected.ok()) return WithExitCode(connected.status(), kWorkerClusterFailed);
    cluster = std::move(*connected);
    spdlog::info("cluster of {} ranks ready at {} (this is rank {})", cluster->size(), options.cluster_store,
                 options.rank);
    if (options.rank > 0) {
      return RunClusterFollower(config, cache, options, *cluster, stop, FollowerPartsOf(config, options, *cluster));
    }
  }
  Worker worker(config, options, stop, cluster.get());
  return worker.Run(cache);
}

}  // namespace diloco
