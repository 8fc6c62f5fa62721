// diloco-worker: one DiLoCo worker process (see worker_loop.h for its life cycle and exit codes).
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
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
  app.add_option("--coordinator", options.coordinator, "coordinator address HOST:PORT")->required();
  app.add_option("--id", options.id, "worker id, unique in the run (a restarted worker reuses its id)")->required();
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ " + options.id + ": %v");

  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return diloco::kWorkerConfigError;
  }
  spdlog::info("config {} (hash {})", config_path, diloco::ConfigHash(*config));
  at::set_num_threads(static_cast<int>(config->workers.threads));
  if (config->workers.device != "cpu" && !torch::cuda::is_available()) {
    spdlog::error("workers.device: '{}' requested but this LibTorch has no CUDA device; use cpu",
                  config->workers.device);
    return diloco::kWorkerConfigError;
  }
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) {
    spdlog::error("{}", std::string(cache.status().message()));
    return diloco::kWorkerConfigError;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  return diloco::RunWorker(*config, *cache, options, g_stop);
}
