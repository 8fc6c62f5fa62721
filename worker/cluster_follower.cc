#include "worker/cluster_follower.h"

#include <spdlog/spdlog.h>

#include "proto/fragment_plan.h"
#include "worker/trainer.h"

namespace diloco {

int RunClusterFollower(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                       WorkerCluster& cluster, const std::atomic<bool>& stop) {
  int64_t replica_checks = 0;
  try {
    const ClusterCommand shard = cluster.ReceiveCommand();  // the leader's Join told it the worker's shard
    if (shard.kind == ClusterCommand::kStop) return kWorkerDone;
    auto trainer = InnerTrainer::ForShard(config, cache.train_path(), static_cast<int>(shard.a),
                                          static_cast<int>(shard.b), options.rank, cluster.size());
    if (!trainer.ok()) {
      spdlog::error("{}", std::string(trainer.status().message()));
      return kWorkerConfigError;
    }
    InnerTrainer& t = **trainer;
    t.set_gradient_hook([&](const std::vector<torch::Tensor>& params, bool want_stop) {
      return cluster.AverageGradients(params, want_stop);
    });
    if (config.workers.check_replicas) {
      t.set_step_hook([&](const std::vector<torch::Tensor>& params, int64_t step) {
        cluster.CheckReplicas(params, step);
        ++replica_checks;
      });
    }
    NamedTensors theta = t.MakeParameterBuffers();
    std::vector<std::string> names;
    for (const auto& [name, p] : theta) names.push_back(name);
    const FragmentPlan plan(names, config.comm.fragments);
    spdlog::info("rank {} of {} of worker {}: shard {}/{} part {}", options.rank, cluster.size(), options.id,
                 shard.a, shard.b, shard.a * cluster.size() + options.rank);
    while (true) {
      const ClusterCommand c = cluster.ReceiveCommand();
      if (c.kind == ClusterCommand::kLoad) {
        std::vector<torch::Tensor> tensors;
        for (const auto& [name, p] : theta) tensors.push_back(p);
        cluster.Broadcast(tensors);
        t.Load(theta);
      } else if (c.kind == ClusterCommand::kTrain) {
        if (t.TrainSteps(c.a, c.b, &stop).abandoned) {
          spdlog::info("the cluster stopped training; leaving");
          break;
        }
      } else if (c.kind == ClusterCommand::kMerge) {
        const auto& which = plan.members(static_cast<int>(c.a));
        NamedTensors fragment;
        std::vector<torch::Tensor> tensors;
        for (size_t i : which) {
          fragment.push_back(theta[i]);
          tensors.push_back(theta[i].second);
        }
        cluster.Broadcast(tensors);
        t.Merge(fragment, which, c.alpha);
      } else {
        break;  // kStop
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("worker cluster failed (rank {} of {}): {}; leaving", options.rank, cluster.size(), e.what());
    return kWorkerClusterFailed;
  }
  if (config.workers.check_replicas) {
    spdlog::info("replica check: parameters identical to rank 0 after each of {} inner steps", replica_checks);
  }
  return kWorkerDone;
}

}  // namespace diloco
