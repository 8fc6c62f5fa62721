// diloco-worker: one DiLoCo worker process (see worker_loop.h for its life cycle and exit codes).
#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "proto/compute_threads.h"
#include "proto/peer_text.h"
#include "worker/data_parallel.h"
#include "worker/lm/device_choice.h"
#include "worker/lm/torch_compat.h"
#include "worker/worker_loop.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DiLoCo worker: trains H inner steps per round and pushes pseudo-gradients to the coordinator"};
  std::string config_path;
  std::vector<std::string> overrides;
  diloco::WorkerOptions options;
  app.add_option("--config", config_path, "run config (YAML), the same file as the coordinator's")->required();
  std::string mode = "diloco";
  app.add_option("--mode", mode,
                 "diloco (default): a DiLoCo worker; ddp: a rank of the data-parallel baseline "
                 "(no coordinator; --rank and --cluster-store over workers.count x cluster_size ranks)")
      ->check(CLI::IsMember({"diloco", "ddp"}));
  app.add_option("--coordinator", options.coordinator, "coordinator address HOST:PORT (required with --mode diloco)");
  app.add_option("--id", options.id, "worker id, unique in the run (a restarted worker reuses its id)");
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  app.add_option("--rank", options.rank, "workers.cluster_size > 1: this process's rank in the worker's cluster");
  app.add_option("--cluster-store", options.cluster_store,
                 "workers.cluster_size > 1: HOST:PORT of the cluster's c10d store (rank 0 listens there)");
  app.add_option("--cluster-bind", options.cluster_bind,
                 "this rank's own IP address for the cluster's connections (default: the --cluster-store host; set it "
                 "when ranks are on different hosts)");
  std::string device;
  app.add_option("--device", device,
                 "this process's device, overriding workers.device: cpu, cuda (cuda:<local rank>) or cuda:N");
  CLI11_PARSE(app, argc, argv);
  const bool ddp = mode == "ddp";
  if (!ddp && (options.coordinator.empty() || options.id.empty())) {
    std::cerr << "diloco-worker: --coordinator and --id are required (or --mode ddp)\n";
    return diloco::kWorkerConfigError;
  }
  if (absl::Status id = diloco::ValidateWorkerId(options.id); !ddp && !id.ok()) {
    std::cerr << "diloco-worker: --id: " << id.message() << "\n";
    return diloco::kWorkerConfigError;
  }
  const std::string who = ddp                             ? "rank-" + std::to_string(options.rank)
                          : options.cluster_store.empty() ? options.id
                                                          : options.id + "." + std::to_string(options.rank);
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ " + who + ": %v");

  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return diloco::kWorkerConfigError;
  }
  spdlog::info("config {} (hash {})", config_path, diloco::ConfigHash(*config));
  diloco::SetComputeThreads(static_cast<int>(config->workers.threads));
  // The device this process trains on: rank r of a cluster gets cuda:<local rank> from workers.device cuda (LOCAL_RANK
  // when a launcher sets it, else --rank), --device overrides. The resolved device replaces workers.device for the
  // rest of the run (after the config hash above, which stays the file's).
  const char* local_rank_env = std::getenv("LOCAL_RANK");
  const int local_rank = local_rank_env != nullptr ? std::atoi(local_rank_env) : options.rank;
  const diloco::CudaFacts cuda{diloco::torch_compat::CudaBuilt(),
                               diloco::torch_compat::CudaBuilt() ? static_cast<int>(torch::cuda::device_count()) : 0};
  auto chosen = device.empty() ? diloco::ChooseDevice(config->workers.device, "workers.device", local_rank,
                                                      static_cast<int>(config->workers.cluster_size), cuda)
                               : diloco::ChooseDevice(device, "--device", local_rank, 1, cuda);
  if (!chosen.ok()) {
    spdlog::error("{}", std::string(chosen.status().message()));
    return diloco::kWorkerConfigError;
  }
  if (!chosen->warning.empty()) spdlog::warn("{}", chosen->warning);
  config->workers.device = chosen->device;
  if (chosen->device != "cpu") spdlog::info("device {}", chosen->device);
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) {
    spdlog::error("{}", std::string(cache.status().message()));
    return diloco::kWorkerConfigError;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  if (ddp) return diloco::RunDataParallel(*config, *cache, options, g_stop);
  return diloco::RunWorker(*config, *cache, options, g_stop);
}
