// diloco-bench-cluster: one rank of a worker cluster (worker/cluster.h) through whole DiLoCo rounds with the config's
// workers.sharding and comm.cluster_parts, for scripts/bench/cluster, which starts `--ranks` of these on one machine.
// No coordinator: each rank holds and computes what a worker's rank does in a round, with the worker's own code,
// only the gRPC streams left out (the push's chunks are produced and dropped, the pull's bytes are the values the
// rank already has):
//   - comm.cluster_parts false (rank 0 alone talks to the coordinator; worker/worker.cc): rank 0 keeps theta_t, the
//     DiLoCo snapshot, in full (Worker::theta_), loads it and broadcasts it at start; after the inner steps it takes
//     the full pseudo-gradient (InnerTrainer::PseudoGradient), chunks it as the push does, and keeps it while it
//     pulls into theta_t and merges (InnerTrainer::Merge, the broadcast to the other ranks, which receive into buffers
//     of their own as worker/cluster_protocol.cc's Follower::Merge does);
// With --no-buckets a `gradients` rank keeps the full gradient buffer during backward (FlatShard::bucketed false).
//   - comm.cluster_parts true (worker/part_exchange.h): every rank pulls its slice of theta into its slice of the
//     snapshot, also the first time, and keeps only that slice, takes its slice of the pseudo-gradient
//     (PartExchange::PseudoGradientSlice), chunks it as its part's push does, and all-gathers the slices into the
//     parameters (GatherIntoParameters).
// One warm-up inner step after the set-up, then --rounds rounds of --steps timed inner steps. Prints one JSON line:
// the peak RSS of each phase (set-up, inner steps, push, pull + apply; the kernel's high-water mark VmHWM, reset
// before each phase through /proc/self/clear_refs) and of the whole run, the bytes of model state the rank's optimizer
// holds, and the seconds per inner step, of which in collectives. With --prepare it only tokenizes the config's data
// (once, before the ranks start, so that they do not race on the cache). Not a test.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "config/config_enums.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "proto/codec.h"
#include "proto/compute_threads.h"
#include "proto/tensor_chunks.h"
#include "proto/tensor_spec.h"
#include "worker/cluster.h"
#include "worker/flat_adamw.h"
#include "worker/part_exchange.h"
#include "worker/trainer.h"

namespace {

using diloco::NamedTensors;

// The peak RSS since the last ResetPeak, in MB (VmHWM of /proc/self/status).
double PeakRssMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return 0;
}
void ResetPeak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// Bytes of the model state one rank's optimizer holds: the flat parameter and gradient buffers (padded when
// sharded), the moments, and the own gradient slice of workers.sharding gradients.
int64_t StateBytes(const diloco::FlatAdamW& opt) {
  int64_t n = opt.padded_parameters().numel() + opt.exp_avg().numel() + opt.exp_avg_sq().numel();
  if (opt.padded_gradients().defined()) n += opt.padded_gradients().numel();  // none when bucketed
  if (opt.owns_gradient_slice()) n += opt.gradient_piece().numel();
  return 4 * n;
}

std::vector<torch::Tensor> TensorsOf(const NamedTensors& named) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

int64_t DrainChunks(diloco::TensorChunker& chunker) {  // what a push sends, produced and dropped
  diloco::TensorChunk chunk;
  std::string_view raw;
  while (chunker.Next(&chunk, &raw)) {
  }
  return chunker.bytes_emitted();
}

// One rank's DiLoCo state and round, as the worker keeps and does them (see the file comment).
class RankRound {
 public:
  RankRound(const diloco::Config& config, diloco::InnerTrainer& trainer, diloco::WorkerCluster& cluster)
      : config_(config), trainer_(trainer), cluster_(cluster), params_(diloco::NamedParameters(*trainer.model())) {
    all_.resize(params_.size());
    std::iota(all_.begin(), all_.end(), size_t{0});
  }

  absl::Status SetUp() {  // the first pull and load (Worker::PullAll, ClusterLeader::Load)
    torch::NoGradGuard no_grad;
    if (config_.comm.cluster_parts) {
      diloco::WorkerOptions options{"127.0.0.1:1", "bench", cluster_.rank()};  // never dialled
      auto exchange = diloco::PartExchange::Open(config_, options, diloco::Fingerprint(diloco::SpecsOf(params_)),
                                                 cluster_, params_, &trainer_.optimizer());
      if (!exchange.ok()) return exchange.status();
      parts_ = std::move(*exchange);
    }
    if (parts_) {  // every rank pulls its slice into its snapshot (here: the values it has), then the all-gather
      parts_->TakeSnapshot();
      parts_->GatherIntoParameters();
      return absl::OkStatus();
    }
    if (cluster_.rank() == 0) theta_ = Theta();  // followers receive theta into their parameters
    std::vector<torch::Tensor> handles = TensorsOf(params_);
    cluster_.Broadcast(handles);
    return absl::OkStatus();
  }

  int64_t Push() {  // the pseudo-gradient and the push's chunks
    torch::NoGradGuard no_grad;
    const int64_t chunk_bytes = config_.comm.chunk_bytes;
    const diloco::Codec codec = diloco::CodecOf(config_.comm.codec);
    if (parts_) {
      const diloco::TopkParams topk{config_.comm.topk_chunk, config_.comm.topk_per_chunk};
      diloco::TensorChunker chunker(diloco::SpecsOf(params_), parts_->PseudoGradientSlice(), chunk_bytes, codec,
                                    parts_->mine(), topk);
      return DrainChunks(chunker);
    }
    if (cluster_.rank() != 0) return 0;
    delta_ = trainer_.PseudoGradient(theta_, all_);  // kept until the round's end, as Worker::RunRounds keeps it
    diloco::TensorChunker chunker(delta_, chunk_bytes, codec);
    return DrainChunks(chunker);
  }

  void PullAndApply() {  // the pull writes the snapshot in place (here: unchanged values); then the apply
    torch::NoGradGuard no_grad;
    if (parts_) {
      parts_->GatherIntoParameters();
      return;
    }
    if (cluster_.rank() == 0) {
      trainer_.Merge(theta_, all_, 0.0);
      std::vector<torch::Tensor> tensors = TensorsOf(theta_);
      cluster_.Broadcast(tensors);
    } else {
      NamedTensors fragment;  // Follower::Merge
      for (const auto& [name, p] : params_) fragment.emplace_back(name, torch::empty_like(p));
      std::vector<torch::Tensor> tensors = TensorsOf(fragment);
      cluster_.Broadcast(tensors);
      trainer_.Merge(fragment, all_, 0.0);
    }
    delta_.clear();
  }

 private:
  NamedTensors Theta() {  // a pulled theta loaded into the model
    NamedTensors theta = trainer_.MakeParameterBuffers();
    for (size_t i = 0; i < theta.size(); ++i) theta[i].second.copy_(params_[i].second.detach());
    trainer_.Load(theta);
    return theta;
  }

  const diloco::Config& config_;
  diloco::InnerTrainer& trainer_;
  diloco::WorkerCluster& cluster_;
  NamedTensors params_;
  std::vector<size_t> all_;
  std::unique_ptr<diloco::PartExchange> parts_;
  NamedTensors theta_, delta_;
};

int Fail(const std::string& what) {
  std::cerr << "error: " << what << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "diloco-bench-cluster: one rank of a (sharded) worker cluster through DiLoCo rounds: peak RSS and "
      "step time"};
  std::string config_path;
  app.add_option("--config", config_path, "YAML config")->required();
  std::vector<std::string> overrides;
  app.add_option("--set", overrides, "KEY=VALUE override (repeatable)");
  int rank = 0, ranks = 1, threads = 1;
  int64_t steps = 3, rounds = 2;
  std::string store;
  app.add_option("--rank", rank, "this rank");
  app.add_option("--ranks", ranks, "ranks of the cluster (workers.cluster_size is set to it)");
  app.add_option("--store", store, "HOST:PORT of the cluster's store (rank 0 hosts it)");
  app.add_option("--steps", steps, "timed inner steps per round");
  app.add_option("--rounds", rounds, "rounds (after one warm-up inner step)");
  app.add_option("--threads", threads, "intra-op threads of this rank");
  bool prepare = false, no_buckets = false;
  app.add_flag("--prepare", prepare, "only tokenize the config's data, then exit");
  app.add_flag("--no-buckets", no_buckets,
               "workers.sharding gradients with the full gradient buffer, reduce-scattered after backward (as before "
               "worker/gradient_buckets.h)");
  CLI11_PARSE(app, argc, argv);
  overrides.push_back("workers.cluster_size=" + std::to_string(ranks));
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  diloco::SetComputeThreads(threads);
  config->inner.steps = steps;
  config->outer.rounds = rounds + 1;
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return Fail(std::string(cache.status().message()));
  if (prepare) return 0;
  nlohmann::json peaks;
  ResetPeak();
  std::optional<diloco::FlatShard> shard = diloco::ShardOf(*config, rank, ranks);
  if (shard && no_buckets) shard->bucketed = false;
  auto trainer = diloco::InnerTrainer::ForShard(*config, cache->meta_path(), 0, 1, rank, ranks, nullptr, shard);
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));
  auto cluster = diloco::WorkerCluster::Connect(rank, ranks, store, config->workers.cluster_timeout_s);
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  if (absl::Status s = (*cluster)->AttachTo(**trainer, false); !s.ok()) return Fail(std::string(s.message()));
  RankRound round(*config, **trainer, **cluster);
  if (absl::Status s = round.SetUp(); !s.ok()) return Fail(std::string(s.message()));
  (*trainer)->TrainSteps(0, 1);  // warm-up: allocations
  peaks["setup"] = PeakRssMb();
  double train_peak = 0, push_peak = 0, apply_peak = 0, step_seconds = 0, collective_seconds = 0;
  int64_t timed_steps = 0, pushed_bytes = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    ResetPeak();
    const double collective_before = (*cluster)->collective_seconds();
    const diloco::StepStats stats = (*trainer)->TrainSteps(1 + r * steps, steps);
    collective_seconds += (*cluster)->collective_seconds() - collective_before;
    step_seconds += stats.seconds;
    timed_steps += stats.steps;
    train_peak = std::max(train_peak, PeakRssMb());
    ResetPeak();
    pushed_bytes += round.Push();
    push_peak = std::max(push_peak, PeakRssMb());
    ResetPeak();
    round.PullAndApply();
    apply_peak = std::max(apply_peak, PeakRssMb());
  }
  peaks["train"] = train_peak;
  peaks["push"] = push_peak;
  peaks["apply"] = apply_peak;
  double peak = 0;
  for (const auto& [phase, mb] : peaks.items()) peak = std::max(peak, mb.get<double>());
  const diloco::FlatAdamW& opt = (*trainer)->optimizer();
  const nlohmann::json out = {
      {"rank", rank},
      {"ranks", ranks},
      {"sharding", std::string(diloco::EnumName(config->workers.sharding))},
      {"parts", config->comm.cluster_parts},
      {"bucketed", opt.bucketed()},
      {"params", opt.flat_parameters().numel()},
      {"state_mb", static_cast<double>(StateBytes(opt)) / (1 << 20)},
      {"peak_rss_mb", peak},
      {"phase_peak_mb", peaks},
      {"pushed_mb", static_cast<double>(pushed_bytes) / (1 << 20)},
      {"step_s", step_seconds / static_cast<double>(std::max<int64_t>(1, timed_steps))},
      {"collective_s", collective_seconds / static_cast<double>(std::max<int64_t>(1, timed_steps))},
      {"native_reduce_scatter", (*cluster)->native_reduce_scatter()}};
  std::cout << out.dump() << std::endl;
  return 0;
}
