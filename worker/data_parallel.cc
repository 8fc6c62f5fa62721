#include "worker/data_parallel.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "config/text_file.h"
#include "worker/cluster.h"
#include "worker/lm/evaluate.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

// What rank 0 records at each evaluation point; the same keys as the coordinator's summary where they exist.
struct DdpEval {
  int64_t round;  // inner steps / inner.steps: the DiLoCo round at the same step
  int64_t step;
  double val_loss;
  int64_t tokens;            // all ranks
  int64_t bytes_all_reduce;  // all ranks, ring all-reduce of fp32 gradients
  double seconds;
};

void WriteSummary(const Config& config, int ranks, int64_t params, int64_t round, int64_t tokens, int64_t bytes,
                  double seconds, const std::vector<DdpEval>& evals) {
  nlohmann::json s;
  s["mode"] = "ddp";
  s["run_name"] = config.run.name;
  s["round"] = round;
  s["rounds_total"] = config.outer.rounds;
  s["phase"] = round >= config.outer.rounds ? "complete" : "training";
  s["params"] = params;
  s["ranks"] = ranks;
  s["tokens"] = tokens;
  s["bytes_sent"] = bytes;  // every rank's all-reduce traffic, summed
  s["dp_equivalent_bytes"] = bytes;
  s["seconds"] = seconds;
  s["evals"] = nlohmann::json::array();
  for (const DdpEval& e : evals) {
    s["evals"].push_back({{"round", e.round}, {"step", e.step}, {"val_loss", e.val_loss}, {"tokens", e.tokens},
                          {"bytes_communicated", e.bytes_all_reduce}, {"seconds", e.seconds}});
  }
  s["workers"] = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    s["workers"].push_back({{"id", "rank-" + std::to_string(r)}, {"tokens", tokens / ranks}, {"cluster_size", 1},
                            {"rounds_contributed", round}});
  }
  const absl::Status written = WriteTextFileAtomically(config.run.output_dir + "/summary.json", s.dump(2) + "\n");
  if (!written.ok()) spdlog::error("{}", std::string(written.message()));
}

}  // namespace

int RunDataParallel(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                    const std::atomic<bool>& stop) {
  if (!config.model.init_from.empty()) {
    spdlog::error("model.init_from: not supported with --mode ddp (the baseline starts from model: and run.seed)");
    return kWorkerConfigError;
  }
  const int cs = static_cast<int>(config.workers.cluster_size);
  const int ranks = static_cast<int>(config.workers.count) * cs;
  if (options.rank < 0 || options.rank >= ranks) {
    spdlog::error("--rank {}: must be in [0, workers.count x workers.cluster_size = {})", options.rank, ranks);
    return kWorkerConfigError;
  }
  if (options.cluster_store.empty()) {
    spdlog::error("--mode ddp: pass --rank and --cluster-store HOST:PORT (rank 0 hosts the store)");
    return kWorkerConfigError;
  }
  // Rank g reads what rank g % cs of DiLoCo worker g / cs reads.
  auto trainer = InnerTrainer::ForShard(config, cache.train_path(), options.rank / cs,
                                        static_cast<int>(config.workers.count), options.rank % cs, cs);
  if (!trainer.ok()) {
    spdlog::error("{}", std::string(trainer.status().message()));
    return kWorkerConfigError;
  }
  std::optional<TokenData> val;
  if (options.rank == 0) {
    auto loaded = TokenData::Load(cache.val_path(), config.model.seq_len);
    if (!loaded.ok()) {
      spdlog::error("{}", std::string(loaded.status().message()));
      return kWorkerConfigError;
    }
    val = std::move(*loaded);
  }
  auto connected = WorkerCluster::Connect(options.rank, ranks, options.cluster_store, config.workers.cluster_timeout_s,
                                          options.cluster_bind);
  if (!connected.ok()) {
    spdlog::error("{}", std::string(connected.status().message()));
    return kWorkerClusterFailed;
  }
  WorkerCluster& cluster = **connected;
  InnerTrainer& t = **trainer;
  t.set_gradient_hook([&](const std::vector<torch::Tensor>& params, bool want_stop) {
    return cluster.AverageGradients(params, want_stop);
  });
  int64_t replica_checks = 0;
  if (config.workers.check_replicas) {
    t.set_step_hook([&](const std::vector<torch::Tensor>& params, int64_t step) {
      cluster.CheckReplicas(params, step);
      ++replica_checks;
    });
  }
  int64_t params = 0;
  for (const auto& p : t.model()->parameters()) params += p.numel();
  const int64_t bytes_per_step = ranks > 1 ? 2 * (ranks - 1) * 4 * params : 0;  // all ranks, ring all-reduce
  TransformerLM eval_model = MakeTransformerLM(config.model, config.run.seed);
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<DdpEval> evals;
  int64_t tokens = 0;
  auto evaluate = [&](int64_t round) {
    LoadParameters(*eval_model, NamedParameters(*t.model()));
    const int64_t step = round * config.inner.steps;
    evals.push_back({round, step, EvaluateLoss(eval_model, *val, config.coordinator.eval_batches,
                                               config.inner.batch_size),
                     tokens, step * bytes_per_step, seconds()});
    spdlog::info("step {}/{} (round {}): val_loss {:.4f}, {} tokens, {} bytes all-reduced", step,
                 config.outer.rounds * config.inner.steps, round, evals.back().val_loss, tokens, step * bytes_per_step);
  };
  const int64_t eval_every = config.coordinator.eval_every;
  if (options.rank == 0) {
    spdlog::info("data parallel: {} ranks, batch {} each, {} steps, {} params", ranks, config.inner.batch_size,
                 config.outer.rounds * config.inner.steps, params);
    if (eval_every > 0) evaluate(0);
  }
  int64_t round = 0;
  double train_seconds = 0;
  try {
    for (; round < config.outer.rounds; ++round) {
      const StepStats s = t.TrainSteps(round * config.inner.steps, config.inner.steps, &stop);
      if (s.abandoned) {
        spdlog::info("stopped at round {} (a rank was signalled)", round);
        break;
      }
      tokens += s.tokens * ranks;
      train_seconds += s.seconds;
      if (options.rank != 0) continue;
      spdlog::info("round {}/{}: train loss {:.4f}, {:.0f} tokens/s per rank", round + 1, config.outer.rounds,
                   s.loss_sum / static_cast<double>(s.steps), static_cast<double>(s.tokens) / s.seconds);
      const bool last = round + 1 == config.outer.rounds;
      if (eval_every > 0 && ((round + 1) % eval_every == 0 || last)) evaluate(round + 1);
      WriteSummary(config, ranks, params, round + 1, tokens, (round + 1) * config.inner.steps * bytes_per_step,
                   seconds(), evals);
    }
  } catch (const std::exception& e) {
    spdlog::error("data-parallel run failed (a rank died or a collective broke): {}", e.what());
    return kWorkerClusterFailed;
  }
  if (config.workers.check_replicas) {
    spdlog::info("replica check: parameters identical on all {} ranks after each of {} inner steps", ranks,
                 replica_checks);
  }
  const double compute = train_seconds - cluster.collective_seconds();
  spdlog::info("compute utilisation: {:.1f}% ({:.1f} s computing, {:.1f} s in all-reduce, {:.1f} s wall)",
               100 * compute / seconds(), compute, cluster.collective_seconds(), seconds());
  if (options.rank == 0 && !stop) {
    spdlog::info("data-parallel run complete: {} rounds of {} steps", round, config.inner.steps);
  }
  return kWorkerDone;
}

}  // namespace diloco
