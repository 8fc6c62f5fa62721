#include "worker/data_parallel.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "config/text_file.h"
#include "worker/cluster.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/init_from.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

// How long ranks > 0 wait for rank 0's evaluation: in effect as long as rank 0 lives (Take throws once the store's
// host, rank 0, is gone). An evaluation of a large model on the CPU takes minutes; a collective would time out.
constexpr std::chrono::milliseconds kEvaluationWait = std::chrono::hours(24);

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
    s["evals"].push_back({{"round", e.round},
                          {"step", e.step},
                          {"val_loss", e.val_loss},
                          {"tokens", e.tokens},
                          {"bytes_communicated", e.bytes_all_reduce},
                          {"seconds", e.seconds}});
  }
  s["workers"] = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    s["workers"].push_back({{"id", "rank-" + std::to_string(r)},
                            {"tokens", tokens / ranks},
                            {"cluster_size", 1},
                            {"rounds_contributed", round}});
  }
  const absl::Status written = WriteTextFileAtomically(config.run.output_dir + "/summary.json", s.dump(2) + "\n");
  if (!written.ok()) spdlog::error("{}", std::string(written.message()));
}

// One rank of the data-parallel baseline: set up (checks, trainer, validation split, cluster), train the rounds
// (rank 0 evaluates and writes the summary), report. Lives for one RunDataParallel call; one thread.
class DataParallelRun {
 public:
  DataParallelRun(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop)
      : config_(config),
        options_(options),
        stop_(stop),
        cluster_size_(static_cast<int>(config.workers.cluster_size)),
        ranks_(static_cast<int>(config.workers.count) * cluster_size_) {}

  // The start-up steps; an error carries its exit code (worker/worker_options.h).
  absl::Status SetUp(const TokenCache& cache);
  absl::Status TrainRounds();
  void Report() const;

 private:
  absl::Status CheckOptions() const;
  absl::Status LoadTheta0();     // model.init_from, into the trainer
  void Evaluate(int64_t round);  // rank 0
  // Rank 0 evaluates; before another round the others wait for it through the cluster's store (as long as rank 0
  // lives).
  void EvaluateWhileOthersWait(int64_t round);
  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  const Config& config_;
  const WorkerOptions& options_;
  const std::atomic<bool>& stop_;
  const int cluster_size_;
  const int ranks_;
  std::chrono::steady_clock::time_point start_;  // set once set-up is done (the summary's clock starts there)
  std::unique_ptr<InnerTrainer> trainer_;
  std::optional<TokenData> val_;  // rank 0 only
  std::unique_ptr<WorkerCluster> cluster_;
  std::optional<EvalReplica> eval_;  // rank 0 only: on the rank's device, as the trainer's model
  int64_t params_ = 0;
  int64_t bytes_per_step_ = 0;  // all ranks, ring all-reduce of fp32 gradients
  int64_t tokens_ = 0;
  int64_t rounds_done_ = 0;
  double train_seconds_ = 0;
  std::vector<DdpEval> evals_;
};

absl::Status DataParallelRun::CheckOptions() const {
  if (options_.rank < 0 || options_.rank >= ranks_) {
    return WorkerError(kWorkerConfigError,
                       absl::StrCat("--rank ", options_.rank,
                                    ": must be in [0, workers.count x workers.cluster_size = ", ranks_, ")"));
  }
  if (options_.cluster_store.empty()) {
    return WorkerError(kWorkerConfigError,
                       "--mode ddp: pass --rank and --cluster-store HOST:PORT (rank 0 hosts the store)");
  }
  return absl::OkStatus();
}

absl::Status DataParallelRun::LoadTheta0() {
  LanguageModelPtr start = MakeLanguageModel(config_.model, config_.run.seed);
  std::string source;
  if (absl::Status s = LoadInitFrom(config_.model, *start, &source); !s.ok()) {
    return WithExitCode(s, kWorkerConfigError);
  }
  trainer_->Load(NamedParameters(*start));  // through the trainer, which owns its parameters' storage
  if (options_.rank == 0) spdlog::info("theta_0 from {}", source);
  return absl::OkStatus();
}

absl::Status DataParallelRun::SetUp(const TokenCache& cache) {
  if (absl::Status s = CheckOptions(); !s.ok()) return s;
  // Rank g reads what rank g % cs of DiLoCo worker g / cs reads.
  auto trainer = InnerTrainer::ForShard(config_, cache.meta_path(), options_.rank / cluster_size_,
                                        static_cast<int>(config_.workers.count), options_.rank % cluster_size_,
                                        cluster_size_, nullptr, ShardOf(config_, options_.rank, ranks_));
  if (!trainer.ok()) return WithExitCode(trainer.status(), kWorkerConfigError);
  trainer_ = std::move(*trainer);
  if (!config_.model.init_from.empty()) {  // every rank reads the same theta_0, as DiLoCo's workers pull it
    if (absl::Status s = LoadTheta0(); !s.ok()) return s;
  }
  if (options_.rank == 0) {
    auto loaded = TokenData::Load(cache.meta_path(), TokenSplit::kVal, config_.model.seq_len);
    if (!loaded.ok()) return WithExitCode(loaded.status(), kWorkerConfigError);
    val_ = std::move(*loaded);
  }
  auto connected =
      WorkerCluster::Connect(options_.rank, ranks_, options_.cluster_store, config_.workers.cluster_timeout_s,
                             options_.cluster_bind, torch::Device(config_.workers.device));
  if (!connected.ok()) return WithExitCode(connected.status(), kWorkerClusterFailed);
  cluster_ = std::move(*connected);
  if (absl::Status s = cluster_->AttachTo(*trainer_, config_.workers.check_replicas); !s.ok()) {
    return WithExitCode(s, kWorkerClusterFailed);
  }
  for (const auto& p : trainer_->model()->parameters()) params_ += p.numel();
  bytes_per_step_ = ranks_ > 1 ? 2 * (ranks_ - 1) * 4 * params_ : 0;
  if (options_.rank == 0) eval_.emplace(config_.model, config_.run.seed, torch::Device(config_.workers.device));
  start_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

void DataParallelRun::EvaluateWhileOthersWait(int64_t round) {
  // After the last round the others have nothing left to wait for (and rank 0, the store's host, may exit first).
  const bool others_wait = round < config_.outer.rounds && ranks_ > 1;
  if (options_.rank == 0) {
    Evaluate(round);
    if (!others_wait) return;
    for (int r = 1; r < ranks_; ++r) cluster_->Put(absl::StrCat("evaluated/", round, "/", r), "");
  } else if (others_wait) {
    // Not inside a collective: its timeout (workers.cluster_timeout_s) would end the run during a long evaluation.
    cluster_->Take(absl::StrCat("evaluated/", round, "/", options_.rank), kEvaluationWait);
  }
}

void DataParallelRun::Evaluate(int64_t round) {
  const int64_t step = round * config_.inner.steps;
  evals_.push_back(
      {round, step,
       eval_->Evaluate(*trainer_->model(), *val_, config_.coordinator.eval_batches, config_.inner.batch_size), tokens_,
       step * bytes_per_step_, Seconds()});
  spdlog::info("step {}/{} (round {}): val_loss {:.4f}, {} tokens, {} bytes all-reduced", step,
               config_.outer.rounds * config_.inner.steps, round, evals_.back().val_loss, tokens_,
               step * bytes_per_step_);
}

absl::Status DataParallelRun::TrainRounds() {
  const int64_t eval_every = config_.coordinator.eval_every;
  if (options_.rank == 0) {
    spdlog::info("data parallel: {} ranks, batch {} each, {} steps, {} params", ranks_, config_.inner.batch_size,
                 config_.outer.rounds * config_.inner.steps, params_);
  }
  try {
    if (eval_every > 0) EvaluateWhileOthersWait(0);
    for (; rounds_done_ < config_.outer.rounds; ++rounds_done_) {
      const int64_t round = rounds_done_;
      const StepStats s =
          trainer_->TrainSteps(round * config_.inner.steps, config_.inner.steps, [this] { return stop_.load(); });
      if (s.abandoned) {
        spdlog::info("stopped at round {} (a rank was signalled)", round);
        break;
      }
      tokens_ += s.tokens * ranks_;
      train_seconds_ += s.seconds;
      const bool last = round + 1 == config_.outer.rounds;
      if (options_.rank == 0) {
        spdlog::info("round {}/{}: train loss {:.4f}, {:.0f} tokens/s per rank", round + 1, config_.outer.rounds,
                     s.loss_sum / static_cast<double>(s.steps), static_cast<double>(s.tokens) / s.seconds);
      }
      if (eval_every > 0 && ((round + 1) % eval_every == 0 || last)) EvaluateWhileOthersWait(round + 1);
      if (options_.rank != 0) continue;
      WriteSummary(config_, ranks_, params_, round + 1, tokens_, (round + 1) * config_.inner.steps * bytes_per_step_,
                   Seconds(), evals_);
    }
  } catch (const std::exception& e) {
    return WorkerError(kWorkerClusterFailed,
                       absl::StrCat("data-parallel run failed (a rank died or a collective broke): ", e.what()));
  }
  return absl::OkStatus();
}

void DataParallelRun::Report() const {
  if (config_.workers.check_replicas) {
    spdlog::info("replica check: parameters identical on all {} ranks after each of {} inner steps", ranks_,
                 cluster_->replica_checks());
  }
  const double compute = train_seconds_ - cluster_->collective_seconds();
  spdlog::info("compute utilisation: {:.1f}% ({:.1f} s computing, {:.1f} s in all-reduce, {:.1f} s wall)",
               100 * compute / Seconds(), compute, cluster_->collective_seconds(), Seconds());
  if (options_.rank == 0 && !stop_) {
    spdlog::info("data-parallel run complete: {} rounds of {} steps", rounds_done_, config_.inner.steps);
  }
}

}  // namespace

absl::Status RunDataParallel(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                             const std::atomic<bool>& stop) {
  DataParallelRun run(config, options, stop);
  if (absl::Status s = run.SetUp(cache); !s.ok()) return s;
  if (absl::Status s = run.TrainRounds(); !s.ok()) return s;
  run.Report();
  return absl::OkStatus();
}

}  // namespace diloco
