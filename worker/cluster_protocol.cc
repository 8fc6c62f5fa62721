#include "worker/cluster_protocol.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "proto/fragment_plan.h"
#include "worker/lm/language_model.h"
#include "worker/local_state.h"

namespace diloco {
namespace {

enum CommandKind : int64_t {
  kShard = 1,
  kLoad = 2,
  kTrain = 3,
  kMerge = 4,
  kStop = 5,
  kSave = 6,
  kPushPart = 7,
  kPullPart = 8,
  kGather = 9,
  kResetMoments = 10,
  kSettle = 11
};

// ClusterLeader::Stop's reason for an exit code other than 0, one key per follower (Take deletes what it reads).
std::string StopReasonKey(int rank) { return absl::StrCat("stop/reason/", rank); }

// A StopCommand as the follower leaves on it: the leader's exit code and, when not 0, its line.
struct StopOutcome {
  int64_t code = 0;
  std::string reason;  // "" when the leader put none (or it could not be read)
};

// Takes the leader's line (ClusterLeader::Stop puts it before it sends the command) and then acknowledges the
// command: the leader waits for that, so its store lives until the line is read.
StopOutcome TakeStop(WorkerCluster& cluster, const StopCommand& stop) {
  StopOutcome outcome{stop.exit_code, ""};
  if (stop.exit_code != 0) {
    try {
      outcome.reason = cluster.Take(StopReasonKey(cluster.rank()), std::chrono::seconds(10));
    } catch (const std::exception&) {
    }
  }
  cluster.Acknowledge();
  return outcome;
}

std::vector<torch::Tensor> TensorsOf(const NamedTensors& named) {
  std::vector<torch::Tensor> tensors;  // shallow handles: a broadcast into them writes the named tensors
  for (const auto& [name, t] : named) tensors.push_back(t);
  return tensors;
}

}  // namespace

CommandWords EncodeCommand(const ClusterCommand& command) {
  CommandWords w{};
  if (const auto* c = std::get_if<ShardCommand>(&command)) {
    w = {kShard, c->shard_index, c->shard_count, c->shard_reader};
  } else if (std::holds_alternative<LoadCommand>(command)) {
    w[0] = kLoad;
  } else if (const auto* c = std::get_if<TrainCommand>(&command)) {
    w = {kTrain, c->first_step, c->steps, 0};
  } else if (const auto* c = std::get_if<MergeCommand>(&command)) {
    w = {kMerge, c->fragment, 0, 0};
    std::memcpy(&w[3], &c->alpha, sizeof(double));
  } else if (const auto* c = std::get_if<SaveCommand>(&command)) {
    w = {kSave, c->round, 0, 0};
  } else if (const auto* c = std::get_if<PushPartCommand>(&command)) {
    w = {kPushPart, c->round, c->seq, 0};
  } else if (const auto* c = std::get_if<PullPartCommand>(&command)) {
    w = {kPullPart, 0, c->seq, 0};
  } else if (std::holds_alternative<GatherCommand>(command)) {
    w[0] = kGather;
  } else if (std::holds_alternative<ResetMomentsCommand>(command)) {
    w[0] = kResetMoments;
  } else if (const auto* c = std::get_if<SettleCommand>(&command)) {
    w = {kSettle, c->counted ? 1 : 0, 0, 0};
  } else {
    w = {kStop, std::get<StopCommand>(command).exit_code, 0, 0};
  }
  return w;
}

ClusterCommand DecodeCommand(const CommandWords& w) {
  switch (w[0]) {
    case kShard:
      return ShardCommand{w[1], w[2], w[3]};
    case kLoad:
      return LoadCommand{};
    case kTrain:
      return TrainCommand{w[1], w[2]};
    case kMerge: {
      MergeCommand c{w[1], 0.0};
      std::memcpy(&c.alpha, &w[3], sizeof(double));
      return c;
    }
    case kStop:
      return StopCommand{w[1]};
    case kSave:
      return SaveCommand{w[1]};
    case kPushPart:
      return PushPartCommand{w[1], w[2]};
    case kPullPart:
      return PullPartCommand{w[2]};
    case kGather:
      return GatherCommand{};
    case kResetMoments:
      return ResetMomentsCommand{};
    case kSettle:
      return SettleCommand{w[1] != 0};
    default:
      throw std::runtime_error(absl::StrCat("unknown cluster command kind ", w[0]));
  }
}

void ClusterLeader::Send(const ClusterCommand& command) { cluster_.SendWords(EncodeCommand(command)); }

void ClusterLeader::Stop(int64_t exit_code, const std::string& reason) {
  if (exit_code != 0) {  // each follower takes its copy before it acknowledges the stop
    for (int r = 1; r < cluster_.size(); ++r) cluster_.Put(StopReasonKey(r), reason);
  }
  Send(StopCommand{exit_code});
}

void ClusterLeader::Load(const NamedTensors& theta) {
  Send(LoadCommand{});
  std::vector<torch::Tensor> tensors = TensorsOf(theta);
  cluster_.Broadcast(tensors);
}

void ClusterLeader::Merge(int fragment, double alpha, const NamedTensors& incoming) {
  Send(MergeCommand{fragment, alpha});
  std::vector<torch::Tensor> tensors = TensorsOf(incoming);
  cluster_.Broadcast(tensors);
}

namespace {

// The follower's side, one method per command. Load broadcasts into the model's parameters; Merge receives the
// fragment into buffers on their device.
class Follower {
 public:
  Follower(const Config& config, WorkerCluster& cluster, InnerTrainer& trainer, LocalState& local,
           const std::atomic<bool>& stop, std::unique_ptr<FollowerParts> parts)
      : cluster_(cluster),
        trainer_(trainer),
        local_(local),
        stop_(stop),
        params_(NamedParameters(*trainer.model())),
        parts_(std::move(parts)) {
    std::vector<std::string> names;
    for (const auto& [name, p] : params_) names.push_back(name);
    plan_ = FragmentPlan(names, config.comm.fragments);
  }

  // Does commands until one ends the follower's part in the run: the leader's StopCommand (its code and line), or
  // code 0 when the cluster's stop wish abandoned a training.
  StopOutcome Serve() {
    while (true) {
      const ClusterCommand command = DecodeCommand(cluster_.ReceiveWords());
      if (const auto* stop = std::get_if<StopCommand>(&command)) return TakeStop(cluster_, *stop);
      cluster_.Acknowledge();  // before the command's collectives: the leader starts them once every rank is there
      if (std::holds_alternative<LoadCommand>(command)) {
        // Straight into the model's parameters, on their device: no host round trip on a GPU rank.
        torch::NoGradGuard no_grad;
        std::vector<torch::Tensor> tensors = TensorsOf(params_);
        cluster_.Broadcast(tensors);
        if (parts_) parts_->Loaded();
      } else if (const auto* push = std::get_if<PushPartCommand>(&command); push && parts_) {
        parts_->Push(*push);
      } else if (const auto* pull = std::get_if<PullPartCommand>(&command); pull && parts_) {
        parts_->Pull(*pull);
      } else if (std::holds_alternative<GatherCommand>(command) && parts_) {
        parts_->Gather();
      } else if (const auto* settle = std::get_if<SettleCommand>(&command); settle && parts_) {
        parts_->Settle(settle->counted);
      } else if (const auto* train = std::get_if<TrainCommand>(&command)) {
        local_.BeforeFirstStep();
        if (trainer_.TrainSteps(train->first_step, train->steps, [this] { return stop_.load(); }).abandoned) {
          spdlog::info("the cluster stopped training; leaving");
          return {};
        }
      } else if (const auto* merge = std::get_if<MergeCommand>(&command)) {
        Merge(*merge);
      } else if (const auto* save = std::get_if<SaveCommand>(&command)) {
        local_.Save(save->round);
      } else if (std::holds_alternative<ResetMomentsCommand>(command)) {
        trainer_.optimizer().ResetMoments();
      } else {
        return {};  // a second ShardCommand never comes
      }
    }
  }

 private:
  void Merge(const MergeCommand& merge) {
    const auto& which = plan_.members(static_cast<int>(merge.fragment));
    NamedTensors fragment;  // received on the parameters' device (the merge then copies nothing across devices)
    for (size_t i : which) fragment.emplace_back(params_[i].first, torch::empty_like(params_[i].second));
    std::vector<torch::Tensor> tensors = TensorsOf(fragment);
    cluster_.Broadcast(tensors);
    trainer_.Merge(fragment, which, merge.alpha);
  }

  WorkerCluster& cluster_;
  InnerTrainer& trainer_;
  LocalState& local_;  // this rank's resumable state (worker/local_state.h)
  const std::atomic<bool>& stop_;
  NamedTensors params_;  // handles to the trained model's parameters (Load broadcasts into them)
  FragmentPlan plan_;
  std::unique_ptr<FollowerParts> parts_;  // comm.cluster_parts; null: rank 0 alone exchanges
};

}  // namespace

absl::Status RunClusterFollower(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                                WorkerCluster& cluster, const std::atomic<bool>& stop,
                                const FollowerPartsFactory& parts) {
  try {
    // The leader's Join tells it the worker's shard: it may take as long as the coordinator takes to answer.
    const ClusterCommand first = DecodeCommand(cluster.ReceiveWords());
    const auto* shard = std::get_if<ShardCommand>(&first);
    if (shard == nullptr) {  // StopCommand: the leader could not join (or was asked to stop before it joined)
      const auto [code, reason] = TakeStop(cluster, std::get<StopCommand>(first));
      if (code == 0) return absl::OkStatus();
      const std::string why = code == kWorkerInterrupted ? "was asked to stop before it joined the coordinator"
                              : reason.empty()
                                  ? absl::StrCat("could not join the coordinator (exit ", code, "; its log says why)")
                                  : absl::StrCat("could not join (exit ", code, "): ", reason);
      return WorkerError(static_cast<WorkerExit>(code),
                         absl::StrCat("rank 0 of worker ", options.id, " ", why, "; leaving"));
    }
    auto trainer =
        InnerTrainer::ForShard(config, cache.meta_path(), static_cast<int>(shard->shard_index),
                               static_cast<int>(shard->shard_count), options.rank, cluster.size(), nullptr,
                               ShardOf(config, options.rank, cluster.size()), static_cast<int>(shard->shard_reader));
    cluster.Acknowledge();  // once its trainer is built: from now on it polls between commands
    if (!trainer.ok()) return WithExitCode(trainer.status(), kWorkerConfigError);
    InnerTrainer& t = **trainer;
    if (absl::Status s = cluster.AttachTo(t, config.workers.check_replicas); !s.ok()) {
      return WithExitCode(s, kWorkerClusterFailed);
    }
    // This rank's own state; the ranks agree on the round to resume (the leader does the same in its set-up).
    LocalState local(
        config, t,
        IdentityOf(config, cache, options.id, t, shard->shard_index, shard->shard_count, options.rank, cluster.size()),
        static_cast<int>(config.comm.fragments),
        [&cluster](const std::string& topic, const std::string& mine) { return cluster.ShareWithRanks(topic, mine); });
    std::unique_ptr<FollowerParts> own_parts;
    if (parts) {
      auto made = parts(t, local);
      if (!made.ok()) return made.status();
      own_parts = std::move(*made);
    }
    Follower follower(config, cluster, t, local, stop, std::move(own_parts));
    spdlog::info("rank {} of {} of worker {}: shard {}/{}, part {} of it", options.rank, cluster.size(), options.id,
                 shard->shard_index, shard->shard_count, options.rank);
    if (const auto [code, reason] = follower.Serve(); code != 0) {
      return WorkerError(static_cast<WorkerExit>(code),
                         absl::StrCat("rank 0 of worker ", options.id, " left the run (exit ", code,
                                      reason.empty() ? "" : "): ", reason.empty() ? "; its log says why)" : reason,
                                      "; this rank leaves with it"));
    }
  } catch (const std::exception& e) {
    return WorkerError(kWorkerClusterFailed, absl::StrCat("worker cluster failed (rank ", options.rank, " of ",
                                                          cluster.size(), "): ", e.what(), "; leaving"));
  }
  if (config.workers.check_replicas) {
    spdlog::info("replica check: parameters identical to rank 0 after each of {} inner steps",
                 cluster.replica_checks());
  }
  return absl::OkStatus();
}

}  // namespace diloco
