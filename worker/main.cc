// diloco-worker: one DiLoCo worker process (see worker/worker_loop.h for its life cycle and
// worker/worker_options.h for its exit codes).
#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "config/cli_flags.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "proto/compute_threads.h"
#include "proto/peer_text.h"
#include "worker/data_parallel.h"
#include "worker/lm/device_choice.h"
#include "worker/lm/matmul_precision.h"
#include "worker/lm/torch_compat.h"
#include "worker/worker_loop.h"
#include "worker/worker_options.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct Flags {
  std::string config_path;
  std::vector<std::string> overrides;
  diloco::WorkerOptions options;
  std::string mode = "diloco";
  std::string device;
  int local_rank = -1;  // -1: LOCAL_RANK, else --rank
  bool fresh = false;   // --fresh: no resume from workers.state_dir at this start
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "run config (YAML), the same file as the coordinator's")->required();
  app.add_option("--mode", f.mode,
                 "diloco (default): a DiLoCo worker; ddp: a rank of the data-parallel baseline "
                 "(no coordinator; --rank and --cluster-store over workers.count x cluster_size ranks)")
      ->check(CLI::IsMember({"diloco", "ddp"}));
  app.add_option("--coordinator", f.options.coordinator, "coordinator address HOST:PORT (required with --mode diloco)")
      ->check(diloco::HostPortFlag());
  app.add_option("--id", f.options.id, "worker id, unique in the run (a restarted worker reuses its id)");
  app.add_option("--set", f.overrides, "override a config key: section.key=value (repeatable)");
  app.add_option("--attack", f.options.attack,
                 "TEST-ONLY: push a wrong pseudo-gradient, KIND[:FACTOR] (scale, max, random, stale, tokens, "
                 "copy:PATH), or fail a training step (nan-step:N, throw-step:N); worker/attack.h");
  app.add_option("--dump-delta", f.options.dump_delta,
                 "TEST-ONLY: write each pushed pseudo-gradient to PATH (read by another worker's --attack copy:PATH)");
  app.add_option("--rank", f.options.rank, "workers.cluster_size > 1: this process's rank in the worker's cluster");
  app.add_option("--cluster-store", f.options.cluster_store,
                 "workers.cluster_size > 1: HOST:PORT of the cluster's c10d store (rank 0 listens there)")
      ->check(diloco::HostPortFlag());
  app.add_option("--cluster-bind", f.options.cluster_bind,
                 "this rank's own IP address for the cluster's connections (default: the --cluster-store host; set it "
                 "when ranks are on different hosts)");
  app.add_option("--device", f.device,
                 "this process's device, overriding workers.device: cpu, cuda (cuda:<local rank mod GPUs>) or cuda:N");
  app.add_option("--local-rank", f.local_rank,
                 "this process's index among the worker processes on this machine, for workers.device cuda "
                 "(diloco-launch sets it; default: the LOCAL_RANK environment variable, else --rank)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--fresh", f.fresh,
               "start cold at this start: ignore this worker's saved state in workers.state_dir (moments, data "
               "position), which its first push then overwrites (diloco-launch --fresh passes it)");
}

// The device this process trains on: workers.device cuda gives the process of local rank r cuda:(r mod GPUs), where
// r is --local-rank (diloco-launch's worker index on this machine), else LOCAL_RANK (torchrun), else --rank;
// --device overrides. The resolved device replaces workers.device for the rest of the run (after the config hash,
// which stays the file's); the start-up line says which device and why.
absl::Status ResolveDevice(const Flags& flags, diloco::Config& config) {
  const char* local_rank_env = std::getenv("LOCAL_RANK");
  const int local_rank = flags.local_rank >= 0       ? flags.local_rank
                         : local_rank_env != nullptr ? std::atoi(local_rank_env)
                                                     : flags.options.rank;
  // The ranks that share one collective group, which must not share a GPU: the cluster's, or all of --mode ddp's.
  const int64_t group =
      flags.mode == "ddp" ? config.workers.count * config.workers.cluster_size : config.workers.cluster_size;
  const diloco::CudaFacts cuda{diloco::torch_compat::CudaBuilt(),
                               diloco::torch_compat::CudaBuilt() ? static_cast<int>(torch::cuda::device_count()) : 0};
  auto chosen = flags.device.empty() ? diloco::ChooseDevice(config.workers.device, "workers.device", local_rank,
                                                            static_cast<int>(group), cuda)
                                     : diloco::ChooseDevice(flags.device, "--device", local_rank, 1, cuda);
  if (!chosen.ok()) return chosen.status();
  if (!chosen->warning.empty()) spdlog::warn("{}", chosen->warning);
  config.workers.device = chosen->device;
  spdlog::info("device {}; float32 matmul precision {}", chosen->why,
               diloco::ApplyMatmulPrecision(config.workers.device, config.workers.allow_tf32));
  return absl::OkStatus();
}

// The start-up steps, then the run. An error carries its exit code (worker/worker_options.h; none: a config error).
absl::Status Run(const Flags& flags) {
  const diloco::WorkerOptions& options = flags.options;
  const bool ddp = flags.mode == "ddp";
  if (!ddp && (options.coordinator.empty() || options.id.empty())) {
    return absl::InvalidArgumentError("diloco-worker: --coordinator and --id are required (or --mode ddp)");
  }
  if (absl::Status id = diloco::ValidateWorkerId(options.id); !ddp && !id.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("diloco-worker: --id: ", id.message()));
  }
  const std::string who = ddp                             ? "rank-" + std::to_string(options.rank)
                          : options.cluster_store.empty() ? options.id
                                                          : options.id + "." + std::to_string(options.rank);
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ " + who + ": %v");
  auto config = diloco::LoadConfig(flags.config_path, flags.overrides);
  if (!config.ok()) return config.status();
  spdlog::info("config {} (hash {})", flags.config_path, diloco::ConfigHash(*config));
  if (flags.fresh && config->workers.resume) {
    spdlog::info("--fresh: not resuming the saved state in {}", config->WorkerStateDir());
    config->workers.resume = false;  // read once, at set-up (worker/local_state.h)
  }
  diloco::SetComputeThreads(static_cast<int>(config->workers.threads));
  if (absl::Status s = ResolveDevice(flags, *config); !s.ok()) return s;
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return cache.status();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  if (ddp) return diloco::RunDataParallel(*config, *cache, options, g_stop);
  return diloco::RunWorker(*config, *cache, options, g_stop);
}

// The one place that prints a fatal error (one line: the status's message names the key or path and the fix) and
// picks the exit code.
int Exit(const absl::Status& status) {
  const diloco::WorkerExit code = diloco::ExitCodeOf(status);
  if (code == diloco::kWorkerInterrupted) {
    spdlog::warn("{}", std::string(status.message()));
  } else if (!status.ok()) {
    spdlog::error("{}", std::string(status.message()));
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DiLoCo worker: trains H inner steps per round and pushes pseudo-gradients to the coordinator"};
  Flags flags;
  AddFlags(app, flags);
  if (const int code = diloco::ParseFlags(app, argc, argv); code >= 0) return code;
  return Exit(Run(flags));
}
