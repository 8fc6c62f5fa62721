// diloco-bench-cluster: one rank of a worker cluster's inner loop (worker/cluster.h) with the config's
// workers.sharding, for scripts/bench/cluster, which starts `--ranks` of these on one machine. Each rank builds its
// trainer (the optimizer state of its slice only when sharded), meets the others at --store, runs one warm-up step and
// then --steps timed inner steps, and prints one JSON line: its peak RSS (getrusage: the process's high-water mark,
// LibTorch and the data included), the bytes of model state its optimizer holds (parameters, gradients, moments,
// padding) and the seconds per step, of which in collectives. With --prepare it only tokenizes the config's data
// (once, before the ranks start, so that they do not race on the cache). Not a test.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "config/config_enums.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "proto/compute_threads.h"
#include "worker/cluster.h"
#include "worker/flat_adamw.h"
#include "worker/lm/torch_compat.h"
#include "worker/trainer.h"

namespace {

double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Bytes of the model state one rank's optimizer holds: the flat parameter and gradient buffers (padded when
// sharded), the moments, and the own gradient slice of workers.sharding gradients.
int64_t StateBytes(const diloco::FlatAdamW& opt) {
  int64_t n = opt.padded_parameters().numel() + opt.padded_gradients().numel() + opt.exp_avg().numel() +
              opt.exp_avg_sq().numel();
  if (opt.owns_gradient_slice()) n += opt.gradient_piece().numel();
  return 4 * n;
}

int Fail(const std::string& what) {
  std::cerr << "error: " << what << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"diloco-bench-cluster: one rank of a (sharded) worker cluster's inner loop: peak RSS and step time"};
  std::string config_path;
  app.add_option("--config", config_path, "YAML config")->required();
  std::vector<std::string> overrides;
  app.add_option("--set", overrides, "KEY=VALUE override (repeatable)");
  int rank = 0, ranks = 1, threads = 1;
  int64_t steps = 3;
  std::string store;
  app.add_option("--rank", rank, "this rank");
  app.add_option("--ranks", ranks, "ranks of the cluster (workers.cluster_size is set to it)");
  app.add_option("--store", store, "HOST:PORT of the cluster's store (rank 0 hosts it)");
  app.add_option("--steps", steps, "timed inner steps (after one warm-up step)");
  app.add_option("--threads", threads, "intra-op threads of this rank");
  bool prepare = false;
  app.add_flag("--prepare", prepare, "only tokenize the config's data, then exit");
  CLI11_PARSE(app, argc, argv);
  overrides.push_back("workers.cluster_size=" + std::to_string(ranks));
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  diloco::SetComputeThreads(threads);
  config->inner.steps = steps + 1;
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return Fail(std::string(cache.status().message()));
  if (prepare) return 0;
  auto trainer = diloco::InnerTrainer::ForShard(*config, cache->meta_path(), 0, 1, rank, ranks, nullptr,
                                                diloco::ShardOf(*config, rank, ranks));
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));
  auto cluster = diloco::WorkerCluster::Connect(rank, ranks, store, config->workers.cluster_timeout_s);
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  if (absl::Status s = (*cluster)->AttachTo(**trainer, false); !s.ok()) return Fail(std::string(s.message()));
  (*trainer)->TrainSteps(0, 1);  // warm-up: allocations
  const double collective_before = (*cluster)->collective_seconds();
  const diloco::StepStats stats = (*trainer)->TrainSteps(1, steps);
  const diloco::FlatAdamW& opt = (*trainer)->optimizer();
  const nlohmann::json out = {
      {"rank", rank},
      {"ranks", ranks},
      {"sharding", std::string(diloco::EnumName(config->workers.sharding))},
      {"params", opt.flat_parameters().numel()},
      {"state_mb", static_cast<double>(StateBytes(opt)) / (1 << 20)},
      {"peak_rss_mb", PeakRssMb()},
      {"step_s", stats.seconds / static_cast<double>(stats.steps)},
      {"collective_s", ((*cluster)->collective_seconds() - collective_before) / static_cast<double>(stats.steps)},
      {"native_reduce_scatter", diloco::torch_compat::kGlooHasReduceScatter}};
  std::cout << out.dump() << std::endl;
  return 0;
}
