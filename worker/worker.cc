// The Worker's phases (worker/worker.h): set up, pull, train, pack, exchange, apply, shut down.
#include "worker/worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "proto/tensor_spec.h"
#include "proto/transport_security.h"
#include "worker/lr_schedule.h"

namespace diloco {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

Worker::Worker(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop,
               WorkerCluster* cluster)
    : config_(config), options_(options), stop_(stop), backoff_(5.0), cluster_(cluster) {
  if (cluster_) leader_ = std::make_unique<ClusterLeader>(*cluster_);
  protocol_.coordinator = options_.coordinator;
  protocol_.worker_id = options_.id;
  protocol_.tls = !config_.security.tls_ca.empty() || !config_.security.tls_cert.empty();
  protocol_.late_policy = config_.outer.late_policy;
  protocol_.connect_timeout_s = config_.workers.connect_timeout_s;
}

Worker::~Worker() {
  if (heartbeat_.joinable()) {  // only if Run ended by an exception it did not catch
    done_ = true;
    heartbeat_.join();
  }
}

int Worker::Run(const TokenCache& cache) {
  if (int code = SetUp(cache); code >= 0) return code;
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  const double started = Now();
  try {
    RunRounds();
    if (leader_ && !followers_left_) leader_->Stop();
  } catch (const std::exception& e) {
    spdlog::error("worker cluster failed (a rank died or a collective broke): {}; leaving the run", e.what());
    failed_ = true;
    exit_code_ = kWorkerClusterFailed;
  }
  return ShutDown(started);
}

int Worker::SetUp(const TokenCache& cache) {
  std::vector<std::string> names;
  std::string fingerprint;
  {
    LanguageModelPtr probe = MakeLanguageModel(config_.model, config_.run.seed);
    const NamedTensors probe_params = NamedParameters(*probe);
    fingerprint = Fingerprint(SpecsOf(probe_params));
    fingerprint_ = fingerprint;
    for (const auto& [name, p] : probe_params) names.push_back(name);
  }
  codec_ = CodecOf(config_.comm.codec);
  const SecurityConfig& sec = config_.security;
  auto security = LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, sec.server_name});
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return kWorkerConfigError;
  }
  client_ =
      std::make_unique<CoordinatorClient>(options_.coordinator, options_.id, fingerprint, config_.workers.rpc_timeout_s,
                                          config_.comm.chunk_bytes, codec_, std::move(*security));
  steps_per_sync_ = config_.StepsPerSync();
  overlap_steps_ = config_.comm.overlap_steps;
  plan_ = FragmentPlan(names, config_.comm.fragments);
  error_feedback_.resize(static_cast<size_t>(plan_.fragments()));
  if (config_.comm.error_feedback && codec_ != CODEC_RAW) {
    for (auto& ef : error_feedback_) ef = std::make_unique<ErrorFeedback>(codec_, config_.comm.chunk_bytes);
  }
  if (int code = JoinWithRetry(); code >= 0) {
    if (leader_) leader_->Stop();
    return code;
  }
  return SetUpTrainer(cache);
}

int Worker::SetUpTrainer(const TokenCache& cache) {
  cluster_size_ = cluster_ ? cluster_->size() : 1;
  auto trainer =
      InnerTrainer::ForShard(config_, cache.meta_path(), join_.shard_index(), join_.shard_count(), 0, cluster_size_);
  if (!trainer.ok()) {
    spdlog::error("{}", std::string(trainer.status().message()));
    return kWorkerConfigError;
  }
  trainer_ = std::move(*trainer);
  if (leader_) {
    leader_->Shard(join_.shard_index(), join_.shard_count());
    cluster_->AttachTo(*trainer_, config_.workers.check_replicas);
  }
  SetUpLocalState(cache, fingerprint_);
  theta_ = trainer_->MakeParameterBuffers();
  fragment_theta_.assign(static_cast<size_t>(plan_.fragments()), NamedTensors());
  for (int p = 0; p < plan_.fragments(); ++p) {
    for (size_t i : plan_.members(p)) fragment_theta_[static_cast<size_t>(p)].push_back(theta_[i]);
  }
  return -1;
}

void Worker::RunRounds() {
  const int P = plan_.fragments();
  bool need_full_pull = true;
  int64_t round = 0;  // the round whose fragment syncs next; theta_ holds its global parameters
  while (!Stopping()) {
    if (need_full_pull) {
      if (!PullAll(&round)) return;
      need_full_pull = false;
    }
    round_ = round;
    const int f = plan_.FragmentOfRound(round);
    const StepStats stats = Train(round);
    if (stats.abandoned) return;
    const RoundResult result = Pack(round, f, stats);
    const std::optional<PullResult> pulled = ExchangeRound(round, f, result);
    if (pulled) SaveLocalState(round + 1);
    if (!pulled || carried_.abandoned) return;
    if (pulled->run_complete) {
      spdlog::info("run complete at round {}; leaving", pulled->round);
      return;
    }
    assigned_steps_ = pulled->inner_steps;
    if (pulled->round != round + 1 && (P > 1 || overlap_steps_ > 0)) {  // the run went on without us (or the
      // coordinator restarted): start over. With one fragment and no overlap the pull just made holds all of theta:
      // go on from it.
      spdlog::info("round {}: the global model is at round {}; pulling all of it", round + 1, pulled->round);
      need_full_pull = true;
      continue;
    }
    Apply(f);
    round = pulled->round;
  }
}

bool Worker::PullAll(int64_t* round) {
  const std::optional<PullResult> pulled = PullWithRetry(theta_, -1);
  if (!pulled) return false;
  if (pulled->run_complete) {
    spdlog::info("run complete at round {}; leaving", pulled->round);
    return false;
  }
  if (!keep_local_) {
    trainer_->Load(theta_);
    if (leader_) leader_->Load(theta_);
  }
  keep_local_ = false;
  *round = pulled->round;
  assigned_steps_ = pulled->inner_steps;
  carried_ = StepStats();
  return true;
}

StepStats Worker::Train(int64_t round) {
  // This round's H: the coordinator's (DyLU) or inner.steps; the schedule follows the global progress.
  const int64_t steps = config_.inner.adaptive_steps && assigned_steps_ > 0 ? assigned_steps_ : steps_per_sync_;
  const int64_t first = ScheduleStart(config_, round, carried_.steps);
  StepStats stats = carried_;
  stats.Add(TrainSteps(first, steps - carried_.steps));
  carried_ = StepStats();
  return stats;
}

RoundResult Worker::Pack(int64_t round, int f, const StepStats& stats) {
  const int P = plan_.fragments();
  RoundResult result;
  result.fragment = f;
  result.pseudo_gradient = trainer_->PseudoGradient(fragment_theta_[static_cast<size_t>(f)], plan_.members(f));
  result.tokens = stats.tokens * cluster_size_;  // every rank trained on as many tokens
  result.steps = stats.steps;
  result.first_loss = stats.first_loss;
  result.mean_loss = stats.loss_sum / static_cast<double>(std::max<int64_t>(1, stats.steps));
  result.last_lr = stats.last_lr;
  result.seconds = stats.seconds;
  result.data_epochs = trainer_->epochs();
  if (ErrorFeedback* ef = error_feedback_[static_cast<size_t>(f)].get()) ef->Compensate(result.pseudo_gradient);
  spdlog::info("round {}{}: {} inner steps, loss {:.4f} -> {:.4f}, lr {:.2e}, {:.0f} tokens/s, {:.2f} s", round + 1,
               P > 1 ? absl::StrCat(" (fragment ", f, "/", P, ")") : std::string(), result.steps, result.first_loss,
               result.mean_loss, result.last_lr, result.tokens / result.seconds, result.seconds);
  return result;
}

std::optional<PullResult> Worker::ExchangeRound(int64_t round, int f, const RoundResult& result) {
  // Push, wait for the round to close and pull the fragment's new global value; with overlap the inner loop goes on
  // for tau steps (the first ones of the next round) meanwhile.
  NamedTensors& incoming = fragment_theta_[static_cast<size_t>(f)];  // not read by the inner loop meanwhile
  if (overlap_steps_ == 0) return Exchange(round, result, incoming);
  std::future<std::optional<PullResult>> exchange =
      std::async(std::launch::async, [&] { return Exchange(round, result, incoming); });
  try {
    carried_ = TrainSteps(ScheduleStart(config_, round + 1, 0), overlap_steps_);
  } catch (...) {  // a collective failed: stop the exchange thread before unwinding
    failed_ = true;
    exchange.wait();
    throw;
  }
  return exchange.get();
}

void Worker::Apply(int f) {
  if (keep_local_) {  // outer.late_policy reuse_local after a late push: the local parameters go on
    keep_local_ = false;
    return;
  }
  const NamedTensors& incoming = fragment_theta_[static_cast<size_t>(f)];
  const double alpha = overlap_steps_ > 0 ? config_.comm.merge_alpha : 0.0;
  trainer_->Merge(incoming, plan_.members(f), alpha);
  if (leader_) leader_->Merge(f, alpha, incoming);
}

int Worker::ShutDown(double started) {
  if (cluster_ && config_.workers.check_replicas) {
    spdlog::info("replica check: parameters identical on all {} ranks after each of {} inner steps", cluster_size_,
                 cluster_->replica_checks());
  }
  const double wall = Now() - started;
  spdlog::info("compute utilisation: {:.1f}% ({:.1f} s of inner steps in {:.1f} s since joining)",
               wall > 0 ? 100 * compute_seconds_ / wall : 0.0, compute_seconds_, wall);
  if (stop_) spdlog::info("signal received: leaving the run");
  if (drain_ && !stop_) spdlog::info("leaving at the operator's request");
  done_ = true;
  heartbeat_.join();
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
  LogFirstStepAfterResume();
  if (leader_) leader_->Train(first_step, n);
  const double waited = cluster_ ? cluster_->collective_seconds() : 0;
  StepStats stats = trainer_->TrainSteps(first_step, n, &quit_);
  compute_seconds_ += stats.seconds - ((cluster_ ? cluster_->collective_seconds() : 0) - waited);
  if (stats.abandoned && cluster_) followers_left_ = true;  // they stopped at the same step and left
  return stats;
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

}  // namespace diloco
