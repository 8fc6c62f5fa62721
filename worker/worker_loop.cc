#include "worker/worker_loop.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <optional>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "proto/tensor_spec.h"
#include "proto/transport_security.h"
#include "proto/fragment_plan.h"
#include "worker/client.h"
#include "worker/cluster.h"
#include "worker/cluster_follower.h"
#include "worker/error_feedback.h"
#include "worker/lr_schedule.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kUnknown;
}

// Exponential backoff with full jitter: sleeps a random time in [base/2, base], base doubling up to max_s.
class Backoff {
 public:
  explicit Backoff(double max_s) : max_s_(max_s), rng_(std::random_device{}()) {}
  void Sleep(const std::atomic<bool>& stop) {
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const double t = base_ * jitter(rng_);
    base_ = std::min(max_s_, base_ * 2);
    for (double slept = 0; slept < t && !stop; slept += 0.05) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void Reset() { base_ = 0.2; }

 private:
  double base_ = 0.2;
  double max_s_;
  std::mt19937_64 rng_;
};

ModelSpec SpecOf(const ModelConfig& m) {
  ModelSpec spec;
  spec.set_vocab_size(m.vocab_size);
  spec.set_seq_len(m.seq_len);
  spec.set_n_layer(m.n_layer);
  spec.set_n_head(m.n_head);
  spec.set_d_model(m.d_model);
  return spec;
}

// Everything one worker process holds.
class Worker {
 public:
  Worker(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop, WorkerCluster* cluster)
      : config_(config), options_(options), stop_(stop), backoff_(5.0), cluster_(cluster) {}

  int Run(const TokenCache& cache);

 private:
  // Joins, retrying while the coordinator is unreachable. Returns a WorkerExit on failure, -1 on success.
  int JoinWithRetry();
  // Pushes `result` for `round` until it is counted, the round moves on, or the run ends. Returns false if the
  // worker should give up (stop, refusal).
  bool PushUntilCounted(int64_t round, const RoundResult& result);
  // Pulls all of theta (fragment -1) or one fragment into `dest`, rejoining or retrying as needed; nullopt when
  // the worker must stop (exit_code_ says why).
  std::optional<PullResult> PullWithRetry(NamedTensors& dest, int fragment);
  // PushUntilCounted, then the pull of the pushed fragment's new global value. Runs on its own thread while the
  // inner loop trains on (comm.overlap_steps): it touches only the client, the backoff and the flags.
  std::optional<PullResult> Exchange(int64_t round, const RoundResult& result, NamedTensors& fragment_theta);
  void HeartbeatLoop();
  // The inner loop of the leader: with a cluster, the followers are told to do the same first.
  StepStats TrainSteps(int64_t first_step, int64_t n);
  // True once a signal or an operator's drain asks this worker to go, or its cluster failed.
  bool Stopping() const { return stop_ || drain_ || failed_; }

  const Config& config_;
  const WorkerOptions& options_;
  const std::atomic<bool>& stop_;
  Backoff backoff_;
  WorkerCluster* cluster_;  // null for a one-process worker
  std::atomic<bool> failed_{false};  // a collective of the cluster failed: the exchange thread gives up too
  bool followers_left_ = false;      // the cluster stopped together (no kStop to send)
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<InnerTrainer> trainer_;
  JoinReply join_;
  std::atomic<int64_t> round_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> drain_{false};  // set by the heartbeat thread when the coordinator says drain
  std::atomic<bool> quit_{false};   // stop_ or drain_: polled by the inner loop to abandon a round
  bool keep_local_ = false;         // outer.late_policy reuse_local after a late push
  int exit_code_ = kWorkerDone;
  double compute_seconds_ = 0;  // inner steps, less the cluster's all-reduce waits
  int64_t assigned_steps_ = 0;  // H from the last pull (inner.adaptive_steps); 0 = inner.steps
};

int Worker::JoinWithRetry() {
  const double deadline = Now() + config_.workers.connect_timeout_s;
  bool warned = false, hinted = false;
  const bool tls = !config_.security.tls_ca.empty() || !config_.security.tls_cert.empty();
  backoff_.Reset();
  while (!Stopping()) {
    auto reply = client_->Join(SpecOf(config_.model), static_cast<int32_t>(config_.workers.threads),
                               config_.workers.device, trainer_ ? join_.shard_index() : -1,
                               static_cast<int32_t>(config_.comm.fragments),
                               cluster_ ? cluster_->size() : 1);
    if (reply.ok()) {
      if (trainer_ && reply->shard_index() != join_.shard_index()) {
        spdlog::warn("rejoined with shard {} instead of {}; this worker keeps reading shard {}",
                     reply->shard_index(), join_.shard_index(), join_.shard_index());
        reply->set_shard_index(join_.shard_index());
      }
      join_ = *reply;
      spdlog::info("joined {} at round {}: shard {}/{}; pushes over {}", options_.coordinator, join_.round(),
                   join_.shard_index(), join_.shard_count(),
                   join_.push_port() > 0 ? absl::StrCat("tcp to port ", join_.push_port()) : std::string("grpc"));
      return -1;
    }
    if (!Retryable(reply.status())) {
      spdlog::error("coordinator {} refused worker {}: {}", options_.coordinator, options_.id,
                    std::string(reply.status().message()));
      return kWorkerRefused;
    }
    if (tls && LooksLikeTlsFailure(reply.status())) {  // this worker's own TLS check failed: retrying cannot help
      spdlog::error("TLS handshake with coordinator {} failed: {} (security.tls_ca must hold the CA that signed the "
                    "coordinator's certificate, and the certificate must name the address's host or "
                    "security.server_name)", options_.coordinator, std::string(reply.status().message()));
      return kWorkerRefused;
    }
    const std::string hint = TlsHint(std::string(reply.status().message()), tls);
    if (Now() > deadline) {
      spdlog::error("coordinator {} unreachable for workers.connect_timeout_s = {} s: {}{}{}", options_.coordinator,
                    config_.workers.connect_timeout_s, std::string(reply.status().message()),
                    hint.empty() ? "" : "; ", hint);
      return kWorkerUnreachable;
    }
    if (!hint.empty() && !hinted) spdlog::warn("coordinator {}: {}; retrying", options_.coordinator, hint);
    hinted = hinted || !hint.empty();
    if (!warned) spdlog::info("waiting for coordinator {} ...", options_.coordinator);
    warned = true;
    backoff_.Sleep(stop_);
  }
  return kWorkerInterrupted;
}

void Worker::HeartbeatLoop() {
  const auto interval = std::chrono::milliseconds(std::max<int64_t>(100, join_.heartbeat_interval_ms()));
  while (!done_ && !stop_) {
    for (auto waited = std::chrono::milliseconds(0); waited < interval && !done_ && !stop_;
         waited += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (stop_) quit_ = true;
    if (done_ || stop_) break;
    auto beat = client_->Heartbeat(round_);  // failures are handled by the main loop's own calls
    if (beat.ok() && beat->drain() && !drain_) {
      spdlog::info("the coordinator asks this worker to leave (diloco-ctl leave); abandoning the round");
      drain_ = true;
      quit_ = true;
    }
  }
}

bool Worker::PushUntilCounted(int64_t round, const RoundResult& result) {
  backoff_.Reset();
  bool need_push = true;
  while (!Stopping()) {
    if (need_push) {
      const double t0 = Now();
      auto pushed = client_->Push(round, result);
      if (pushed.ok()) {
        spdlog::info("round {}: pushed {} bytes in {:.3f} s", round + 1, *pushed, Now() - t0);
        need_push = false;
        backoff_.Reset();
      } else if (pushed.status().code() == absl::StatusCode::kFailedPrecondition) {
        keep_local_ = config_.outer.late_policy == LatePolicy::kReuseLocal;
        spdlog::warn("round {}: push not counted ({}); {}", round + 1, std::string(pushed.status().message()),
                     keep_local_ ? "continuing from local parameters (late_policy reuse_local)"
                                 : "restarting from the new global parameters");
        return true;  // the round moved on: pull the new parameters
      } else if (pushed.status().code() == absl::StatusCode::kAlreadyExists) {
        need_push = false;
      } else if (pushed.status().code() == absl::StatusCode::kNotFound) {
        // The coordinator does not know us (it restarted, or declared us lost): join again, then push again; if
        // the round moved on meanwhile, the push is refused as late and we pull.
        if (int code = JoinWithRetry(); code >= 0) {
          exit_code_ = code;
          return false;
        }
      } else if (pushed.status().code() != absl::StatusCode::kAborted) {
        if (!Retryable(pushed.status())) {
          spdlog::error("round {}: push refused: {}", round + 1, std::string(pushed.status().message()));
          exit_code_ = kWorkerRefused;
          return false;
        }
        spdlog::warn("round {}: push failed ({}), retrying", round + 1, std::string(pushed.status().message()));
        backoff_.Sleep(stop_);
      }
      continue;
    }
    if (drain_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto beat = client_->Heartbeat(round);
    if (!beat.ok()) {
      if (beat.status().code() == absl::StatusCode::kNotFound) {
        if (int code = JoinWithRetry(); code >= 0) {
          exit_code_ = code;
          return false;
        }
        need_push = true;  // a restarted coordinator has not counted our push
        continue;
      }
      if (!Retryable(beat.status())) {
        spdlog::error("heartbeat refused: {}", std::string(beat.status().message()));
        exit_code_ = kWorkerRefused;
        return false;
      }
      backoff_.Sleep(stop_);
      continue;
    }
    if (beat->drain()) drain_ = quit_ = true;
    if (beat->run_complete()) return true;
    if (config_.outer.mode == OuterMode::kAsync) {  // our push is applied once it is no longer pending (others' may be too)
      if (beat->pushed()) continue;
      if (beat->round() > round) return true;
    } else if (beat->round() > round) {
      return true;
    }
    if (!beat->pushed()) {
      spdlog::info("round {}: the coordinator restarted the round's aggregation; pushing again", round + 1);
      need_push = true;
    }
  }
  exit_code_ = kWorkerDone;  // asked to go (signal or drain): a clean leave
  return false;
}

std::optional<PullResult> Worker::PullWithRetry(NamedTensors& dest, int fragment) {
  backoff_.Reset();
  while (!Stopping()) {
    auto pulled = client_->Pull(dest, fragment);
    if (pulled.ok()) return *pulled;
    if (pulled.status().code() == absl::StatusCode::kNotFound) {
      if (int code = JoinWithRetry(); code >= 0) {
        exit_code_ = code;
        return std::nullopt;
      }
      continue;
    }
    if (!Retryable(pulled.status())) {
      spdlog::error("pull refused: {}", std::string(pulled.status().message()));
      exit_code_ = kWorkerRefused;
      return std::nullopt;
    }
    spdlog::warn("pull failed ({}), retrying", std::string(pulled.status().message()));
    backoff_.Sleep(stop_);
  }
  return std::nullopt;
}

std::optional<PullResult> Worker::Exchange(int64_t round, const RoundResult& result, NamedTensors& fragment_theta) {
  if (!PushUntilCounted(round, result)) return std::nullopt;
  return PullWithRetry(fragment_theta, result.fragment);
}

int Worker::Run(const TokenCache& cache) {
  TransformerLM probe = MakeTransformerLM(config_.model, config_.run.seed);
  const NamedTensors probe_params = NamedParameters(*probe);
  const std::string fingerprint = Fingerprint(SpecsOf(probe_params));
  const Codec codec = CodecOf(config_.comm.codec);
  const SecurityConfig& sec = config_.security;
  auto security = LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, sec.server_name});
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return kWorkerConfigError;
  }
  client_ = std::make_unique<CoordinatorClient>(options_.coordinator, options_.id, fingerprint,
                                                config_.workers.rpc_timeout_s, config_.comm.chunk_bytes, codec,
                                                std::move(*security));
  // Streaming DiLoCo: round r syncs fragment r mod P after S = H / P inner steps (P = 1: plain DiLoCo).
  const int P = static_cast<int>(config_.comm.fragments);
  const int64_t S = config_.StepsPerSync();
  const int64_t tau = config_.comm.overlap_steps;
  std::vector<std::string> names;
  for (const auto& [name, p] : probe_params) names.push_back(name);
  const FragmentPlan plan(names, P);
  std::vector<std::unique_ptr<ErrorFeedback>> error_feedback(static_cast<size_t>(P));
  if (config_.comm.error_feedback && codec != CODEC_RAW) {
    for (auto& ef : error_feedback) ef = std::make_unique<ErrorFeedback>(codec, config_.comm.chunk_bytes);
  }
  if (int code = JoinWithRetry(); code >= 0) {
    if (cluster_) cluster_->SendCommand({ClusterCommand::kStop});
    return code;
  }

  const int cluster_size = cluster_ ? cluster_->size() : 1;
  auto trainer = InnerTrainer::ForShard(config_, cache.train_path(), join_.shard_index(), join_.shard_count(), 0,
                                        cluster_size);
  if (!trainer.ok()) {
    spdlog::error("{}", std::string(trainer.status().message()));
    return kWorkerConfigError;
  }
  trainer_ = std::move(*trainer);
  int64_t replica_checks = 0;
  if (cluster_) {
    cluster_->SendCommand({ClusterCommand::kShard, join_.shard_index(), join_.shard_count()});
    trainer_->set_gradient_hook([this](const std::vector<torch::Tensor>& params, bool want_stop) {
      return cluster_->AverageGradients(params, want_stop);
    });
    if (config_.workers.check_replicas) {
      trainer_->set_step_hook([&](const std::vector<torch::Tensor>& params, int64_t step) {
        cluster_->CheckReplicas(params, step);
        ++replica_checks;
      });
    }
  }
  // theta: the global value of every tensor as last received (what pseudo-gradients are computed against);
  // fragment_theta[p]: the same tensors of fragment p (views of theta), the destination of a fragment pull.
  NamedTensors theta = trainer_->MakeParameterBuffers();
  std::vector<NamedTensors> fragment_theta(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    for (size_t i : plan.members(p)) fragment_theta[static_cast<size_t>(p)].push_back(theta[i]);
  }
  std::thread heartbeat([this] { HeartbeatLoop(); });
  const double started = Now();

  bool need_full_pull = true;
  int64_t round = 0;  // the round whose fragment syncs next; theta holds its global parameters
  StepStats carried;  // inner steps already trained toward the next push (the overlap)
  try {
  while (!Stopping()) {
    if (need_full_pull) {
      std::optional<PullResult> pulled = PullWithRetry(theta, -1);
      if (!pulled) break;
      if (pulled->run_complete) {
        spdlog::info("run complete at round {}; leaving", pulled->round);
        break;
      }
      if (!keep_local_) {
        trainer_->Load(theta);
        if (cluster_) {
          cluster_->SendCommand({ClusterCommand::kLoad});
          std::vector<torch::Tensor> tensors;
          for (const auto& [name, p] : theta) tensors.push_back(p);
          cluster_->Broadcast(tensors);
        }
      }
      keep_local_ = false;
      round = pulled->round;
      assigned_steps_ = pulled->inner_steps;
      carried = StepStats();
      need_full_pull = false;
    }
    round_ = round;
    const int f = static_cast<int>(round % P);
    // This round's H: the coordinator's (DyLU) or inner.steps; the schedule follows the global progress.
    const int64_t steps = config_.inner.adaptive_steps && assigned_steps_ > 0 ? assigned_steps_ : S;
    const int64_t first = ScheduleStart(config_, round, carried.steps);
    StepStats stats = carried;
    stats.Add(TrainSteps(first, steps - carried.steps));
    carried = StepStats();
    if (stats.abandoned) break;
    RoundResult result;
    result.fragment = f;
    result.pseudo_gradient = trainer_->PseudoGradient(fragment_theta[static_cast<size_t>(f)],
                                                      plan.members(f));
    result.tokens = stats.tokens * cluster_size;  // every rank trained on as many tokens
    result.steps = stats.steps;
    result.first_loss = stats.first_loss;
    result.mean_loss = stats.loss_sum / static_cast<double>(std::max<int64_t>(1, stats.steps));
    result.last_lr = stats.last_lr;
    result.seconds = stats.seconds;
    if (error_feedback[static_cast<size_t>(f)]) error_feedback[static_cast<size_t>(f)]->Compensate(result.pseudo_gradient);
    spdlog::info("round {}{}: {} inner steps, loss {:.4f} -> {:.4f}, lr {:.2e}, {:.0f} tokens/s, {:.2f} s", round + 1,
                 P > 1 ? absl::StrCat(" (fragment ", f, "/", P, ")") : std::string(), result.steps,
                 result.first_loss, result.mean_loss, result.last_lr, result.tokens / result.seconds, result.seconds);
    // Push, wait for the round to close and pull the fragment's new global value; with overlap the inner loop goes on
    // for tau steps (the first ones of the next round) meanwhile.
    std::optional<PullResult> pulled;
    NamedTensors& incoming = fragment_theta[static_cast<size_t>(f)];  // not read by the inner loop meanwhile
    if (tau > 0) {
      std::future<std::optional<PullResult>> exchange =
          std::async(std::launch::async, [&] { return Exchange(round, result, incoming); });
      try {
        carried = TrainSteps(ScheduleStart(config_, round + 1, 0), tau);
      } catch (...) {  // a collective failed: stop the exchange thread before unwinding
        failed_ = true;
        exchange.wait();
        throw;
      }
      pulled = exchange.get();
    } else {
      pulled = Exchange(round, result, incoming);
    }
    if (!pulled || carried.abandoned) break;
    if (pulled->run_complete) {
      spdlog::info("run complete at round {}; leaving", pulled->round);
      break;
    }
    assigned_steps_ = pulled->inner_steps;
    if (pulled->round != round + 1 && (P > 1 || tau > 0)) {  // the run went on without us (or the coordinator
      // restarted): start over. With one fragment and no overlap the pull just made holds all of theta: go on from it.
      spdlog::info("round {}: the global model is at round {}; pulling all of it", round + 1, pulled->round);
      need_full_pull = true;
      continue;
    }
    if (keep_local_) {  // outer.late_policy reuse_local after a late push: the local parameters go on
      keep_local_ = false;
    } else {
      const double alpha = tau > 0 ? config_.comm.merge_alpha : 0.0;
      trainer_->Merge(incoming, plan.members(f), alpha);
      if (cluster_) {
        cluster_->SendCommand({ClusterCommand::kMerge, f, 0, alpha});
        std::vector<torch::Tensor> tensors;
        for (const auto& [name, p] : incoming) tensors.push_back(p);
        cluster_->Broadcast(tensors);
      }
    }
    round = pulled->round;
  }
  if (cluster_ && !followers_left_) cluster_->SendCommand({ClusterCommand::kStop});
  } catch (const std::exception& e) {
    spdlog::error("worker cluster failed (a rank died or a collective broke): {}; leaving the run", e.what());
    failed_ = true;
    exit_code_ = kWorkerClusterFailed;
  }
  if (cluster_ && config_.workers.check_replicas) {
    spdlog::info("replica check: parameters identical on all {} ranks after each of {} inner steps", cluster_size,
                 replica_checks);
  }
  const double wall = Now() - started;
  spdlog::info("compute utilisation: {:.1f}% ({:.1f} s of inner steps in {:.1f} s since joining)",
               wall > 0 ? 100 * compute_seconds_ / wall : 0.0, compute_seconds_, wall);
  if (stop_) spdlog::info("signal received: leaving the run");
  if (drain_ && !stop_) spdlog::info("leaving at the operator's request");
  done_ = true;
  heartbeat.join();
  if (exit_code_ != kWorkerRefused) {
    (void)client_->Leave(stop_                                ? "signal"
                         : drain_                             ? "drained by operator"
                         : exit_code_ == kWorkerClusterFailed ? "its cluster failed"
                         : exit_code_ == kWorkerDone          ? "run complete"
                                                              : "error");
  }
  return exit_code_;
}

StepStats Worker::TrainSteps(int64_t first_step, int64_t n) {
  if (cluster_) cluster_->SendCommand({ClusterCommand::kTrain, first_step, n});
  const double waited = cluster_ ? cluster_->collective_seconds() : 0;
  StepStats stats = trainer_->TrainSteps(first_step, n, &quit_);
  compute_seconds_ += stats.seconds - ((cluster_ ? cluster_->collective_seconds() : 0) - waited);
  if (stats.abandoned && cluster_) followers_left_ = true;  // they stopped at the same step and left
  return stats;
}

}  // namespace

int RunWorker(const Config& config, const TokenCache& cache, const WorkerOptions& options,
              const std::atomic<bool>& stop) {
  std::unique_ptr<WorkerCluster> cluster;
  if (config.workers.cluster_size > 1) {
    if (options.cluster_store.empty()) {
      spdlog::error("workers.cluster_size is {}: pass --rank and --cluster-store HOST:PORT (rank 0 hosts the store)",
                    config.workers.cluster_size);
      return kWorkerConfigError;
    }
    if (options.rank < 0 || options.rank >= config.workers.cluster_size) {
      spdlog::error("--rank {}: must be in [0, workers.cluster_size = {})", options.rank, config.workers.cluster_size);
      return kWorkerConfigError;
    }
    auto connected = WorkerCluster::Connect(options.rank, static_cast<int>(config.workers.cluster_size),
                                            options.cluster_store, config.workers.cluster_timeout_s,
                                            options.cluster_bind);
    if (!connected.ok()) {
      spdlog::error("{}", std::string(connected.status().message()));
      return kWorkerClusterFailed;
    }
    cluster = std::move(*connected);
    spdlog::info("cluster of {} ranks ready at {} (this is rank {})", cluster->size(), options.cluster_store,
                 options.rank);
    if (options.rank > 0) return RunClusterFollower(config, cache, options, *cluster, stop);
  }
  Worker worker(config, options, stop, cluster.get());
  return worker.Run(cache);
}

}  // namespace diloco
