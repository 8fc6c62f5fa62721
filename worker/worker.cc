// The Worker's phases (worker/worker.h): set up, pull, train, pack, exchange, apply, shut down.
#include "worker/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "config/model_spec.h"
#include "config/subprocess.h"
#include "proto/all_finite.h"
#include "proto/codec.h"
#include "proto/tensor_chunks.h"
#include "proto/tensor_spec.h"
#include "proto/topk_codec.h"
#include "worker/lr_schedule.h"

namespace diloco {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Rounds in a row whose training turned non-finite, each from a freshly pulled global model with the moments started
// over, after which the worker leaves (exit 1): the divergence is this worker's settings or data, not chance, and
// every synchronous round would otherwise wait for its push until coordinator.round_timeout_s, forever.
constexpr int kNonFiniteRoundsToLeave = 3;

}  // namespace

Worker::Worker(const Config& config, const WorkerOptions& options, const std::atomic<bool>& stop,
               WorkerCluster* cluster)
    : config_(config), options_(options), flags_(stop), cluster_(cluster) {
  if (cluster_) leader_ = std::make_unique<ClusterLeader>(*cluster_);
}

absl::Status Worker::Run(const TokenCache& cache) {
  absl::Status set_up;
  try {  // with a cluster, set-up commands the followers (a dead follower throws from the collective)
    set_up = SetUp(cache);
  } catch (const std::exception& e) {
    set_up = cluster_
                 ? WorkerError(kWorkerClusterFailed, absl::StrCat("worker cluster failed while setting up: ", e.what()))
                 : WorkerError(kWorkerFailed, absl::StrCat("worker failed while setting up: ", e.what()));
  }
  if (!set_up.ok()) {
    // Failed after the Join: leave at once, so that the round does not wait coordinator.lease_s for this worker.
    if (heartbeat_) heartbeat_->Stop();
    if (session_ && session_->joined()) session_->Leave(flags_.stop ? "signal" : "its set-up failed");
    return set_up;
  }
  const double started = Now();
  try {
    RunRounds();
    // The followers leave with this rank's code and line (a training that diverged every round: exit 1; refused: 3).
    if (leader_ && !followers_left_) leader_->Stop(ExitCodeOf(Outcome()), std::string(Outcome().message()));
  } catch (const std::exception& e) {  // a device error (out of memory); with a cluster, a dead rank or collective
    flags_.failed = true;
    failure_ = cluster_
                   ? WorkerError(kWorkerClusterFailed,
                                 absl::StrCat("worker cluster failed (a rank died or a collective broke): ", e.what(),
                                              "; leaving the run"))
                   : WorkerError(kWorkerFailed, absl::StrCat("worker failed: ", e.what(), "; leaving the run"));
  }
  return ShutDown(started);
}

absl::Status Worker::SetUp(const TokenCache& cache) {
  // The tokenizer's digest, which the coordinator compares at Join: first, before this process holds a model (it
  // forks a diloco-tokenize).
  auto digest = VocabDigestOf(cache, SiblingExecutable("diloco-tokenize"));
  if (!digest.ok()) {
    spdlog::warn("{}; the coordinator will not check this worker's tokenizer", std::string(digest.status().message()));
  }
  auto attack = ParseAttack(options_.attack);
  if (!attack.ok()) return WithExitCode(attack.status(), kWorkerConfigError);
  if (attack->kind == AttackSpec::Kind::kNanStep || attack->kind == AttackSpec::Kind::kThrowStep) {
    spdlog::warn("test-only --attack {}: inner step {} {}", options_.attack, attack->fault_step,
                 attack->kind == AttackSpec::Kind::kNanStep ? "has its loss made NaN" : "throws");
    step_fault_ = *attack;
  } else if (attack->kind != AttackSpec::Kind::kNone) {
    spdlog::warn("test-only --attack {}: this worker pushes wrong pseudo-gradients", options_.attack);
    attacker_ = std::make_unique<Attacker>(*attack, static_cast<uint64_t>(config_.run.seed) + 7919);
  }
  // The model the trainer will train (made now: its parameters name the model to the coordinator at Join, before
  // the Join reply says which shard the trainer reads).
  LanguageModelPtr model = MakeLanguageModel(config_.model, config_.run.seed);
  const NamedTensors params = NamedParameters(*model);
  const std::string fingerprint = Fingerprint(SpecsOf(params));
  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  plan_ = FragmentPlan(names, config_.comm.fragments);
  auto session = CoordinatorSession::Open(config_, options_, fingerprint, ClusterSize(), flags_);
  if (!session.ok()) return session.status();
  session_ = std::move(*session);
  session_->PreferShard(SavedShardHint(config_, options_.id, ClusterSize(), fingerprint));
  session_->DeclareData(DataSpecOf(config_, digest.ok() ? *digest : std::string()));
  if (absl::Status joined = session_->Join(); !joined.ok()) {
    if (leader_) leader_->Stop(ExitCodeOf(joined), std::string(joined.message()));
    return joined;
  }
  // The lease is kept from the Join on: the rest of the set-up can take long (a cluster's model broadcast to its
  // ranks, their shard commands).
  flags_.round = session_->join().round();
  heartbeat_ = std::make_unique<HeartbeatThread>(session_->client(), flags_,
                                                 std::chrono::milliseconds(session_->join().heartbeat_interval_ms()));
  return SetUpTrainer(cache, std::move(model));
}

absl::Status Worker::SetUpTrainer(const TokenCache& cache, LanguageModelPtr model) {
  const JoinReply& join = session_->join();
  auto trainer =
      InnerTrainer::ForShard(config_, cache.meta_path(), join.shard_index(), join.shard_count(), 0, ClusterSize(),
                             std::move(model), ShardOf(config_, 0, ClusterSize()), join.shard_reader());
  if (!trainer.ok()) return WithExitCode(trainer.status(), kWorkerConfigError);
  trainer_ = std::move(*trainer);
  if (step_fault_.kind != AttackSpec::Kind::kNone) {
    trainer_->set_step_fault(step_fault_.fault_step, step_fault_.kind == AttackSpec::Kind::kNanStep
                                                         ? InnerTrainer::StepFault::kNan
                                                         : InnerTrainer::StepFault::kThrow);
  }
  if (leader_) {
    leader_->Shard(join.shard_index(), join.shard_count(), join.shard_reader());
    if (absl::Status s = cluster_->AttachTo(*trainer_, config_.workers.check_replicas); !s.ok()) {
      return WithExitCode(s, kWorkerClusterFailed);
    }
  }
  // Every rank keeps its own local state; a cluster's ranks agree through the store on the round they resume.
  ShareWithRanks share;
  if (cluster_) {
    share = [this](const std::string& topic, const std::string& mine) { return cluster_->ShareWithRanks(topic, mine); };
  }
  local_ = std::make_unique<LocalState>(
      config_, *trainer_,
      IdentityOf(config_, cache, options_.id, *trainer_, join.shard_index(), join.shard_count(), 0, ClusterSize()),
      plan_.fragments(), std::move(share));
  if (cluster_ && config_.comm.cluster_parts) {
    fragment_theta_.assign(1, NamedTensors());  // Exchange's pull goes to the ranks' slices instead
    return SetUpParts();                        // and so does PullAll's (theta_ stays empty)
  }
  theta_ = trainer_->MakeParameterBuffers();
  fragment_theta_.assign(static_cast<size_t>(plan_.fragments()), NamedTensors());
  for (int p = 0; p < plan_.fragments(); ++p) {
    for (size_t i : plan_.members(p)) fragment_theta_[static_cast<size_t>(p)].push_back(theta_[i]);
  }
  return absl::OkStatus();
}

absl::Status Worker::SetUpParts() {
  const NamedTensors params = NamedParameters(*trainer_->model());
  auto parts =
      PartExchange::Open(config_, options_, Fingerprint(SpecsOf(params)), *cluster_, params, &trainer_->optimizer());
  if (!parts.ok()) return parts.status();
  parts_ = std::move(*parts);
  parts_->RestoreResidual(local_->KeepSliceResidual([this] { return parts_->residual(); }));
  part_leader_ = std::make_unique<PartLeader>(config_, *cluster_, *leader_, *parts_);
  session_->UseParts(
      [this](int64_t round, const RoundResult& result) { return part_leader_->Push(round, result.report); },
      [this] { return part_leader_->Pull(); });
  spdlog::info("cluster pushes and pulls in {} parts of {} elements (comm.cluster_parts)", ClusterSize(),
               parts_->plan().slice_length());
  return absl::OkStatus();
}

void Worker::RunRounds() {
  const int P = plan_.fragments();
  // The local state is saved as soon as a push counts, before the wait for the round's close: a worker killed while
  // it waits then resumes the error-feedback residual and moments of the push the coordinator has (before, it resumed
  // the round before's and sent that round's residual a second time). One process without overlap only: nothing
  // trains meanwhile (a cluster's ranks and comm.overlap_steps' next steps save after the pull).
  const bool save_at_count = !cluster_ && config_.comm.overlap_steps == 0;
  if (save_at_count) {
    session_->OnPushCounted([this](int64_t pushed_round) {
      SaveLocalState(pushed_round + 1);
      saved_at_count_ = true;
    });
  }
  bool need_full_pull = true;
  int64_t round = 0;  // the round whose fragment syncs next; theta_ holds its global parameters
  while (!flags_.Stopping()) {
    if (need_full_pull) {
      if (!PullAll(&round)) return;
      need_full_pull = false;
    }
    flags_.round = round;
    const int f = plan_.FragmentOfRound(round);
    const StepStats stats = Train(round);
    if (stats.abandoned) return;  // stopped, drained, or the run completed meanwhile
    if (!TrainingStayedFinite(round, stats)) {
      if (++non_finite_rounds_ >= kNonFiniteRoundsToLeave) {
        failure_ = WorkerError(
            kWorkerFailed,
            absl::StrCat(
                "training turned non-finite in ", non_finite_rounds_,
                " rounds in a row, each from the "
                "global model with the AdamW moments started over: this worker's settings diverge (lower "
                "inner.lr, set inner.grad_clip, raise inner.warmup_steps, or check its data); leaving the run"));
        return;
      }
      need_full_pull = true;
      continue;
    }
    non_finite_rounds_ = 0;
    const RoundResult result = Pack(round, f, stats);
    saved_at_count_ = false;
    const std::optional<PullResult> pulled = ExchangeRound(round, f, result);
    // Error feedback: the residual this push left stands only if the push was counted.
    local_->SettleFeedback(f, session_->push_counted());
    if (part_leader_ && parts_->feedback() && pulled) part_leader_->Settle(session_->push_counted());
    // A worker stopped (signal, drain) or cut off after its push counted saves that round too, so that a restart
    // resumes the moments, data position and residual after it (a cluster's ranks and comm.overlap_steps' next
    // steps: only with a pull).
    // Saved already when the push counted, unless it no longer does (a rejoin or quarantine after it gave its
    // residual back): then saved again, even when the worker stops before a pull.
    const bool counted = session_->push_counted();
    if ((pulled || (save_at_count && (counted || saved_at_count_))) && !(saved_at_count_ && counted)) {
      SaveLocalState(round + 1);
    }
    if (!pulled || carried_.abandoned) return;
    if (const std::string late = uncounted_.Note(round, session_->push_counted()); !late.empty()) {
      spdlog::warn("{}", late);
    }
    if (pulled->run_complete) {
      spdlog::info("run complete after round {}; leaving", pulled->round);
      return;
    }
    assigned_steps_ = pulled->inner_steps;
    if (session_->TakeFullPull() && (P > 1 || config_.comm.overlap_steps > 0)) {
      spdlog::info("round {}: quarantined; pulling all of the global model", round + 1);
      need_full_pull = true;
      continue;
    }
    // The run went on without us (or the coordinator restarted): start over. With one fragment and no overlap the
    // pull just made holds all of theta: go on from it.
    if (pulled->round != round + 1 && (P > 1 || config_.comm.overlap_steps > 0)) {
      spdlog::info("round {}: the coordinator's next round is {}, not {}; pulling all of the global model", round + 1,
                   pulled->round + 1, round + 2);
      need_full_pull = true;
      continue;
    }
    Apply(f);
    round = pulled->round;
  }
}

bool Worker::PullAll(int64_t* round) {
  // With parts every rank pulls its slice into its snapshot (theta_ stays empty: no rank holds a second full copy).
  const std::optional<PullResult> pulled = session_->Pull(theta_, -1);
  if (!pulled) return false;
  if (pulled->run_complete) {
    spdlog::info("run complete after round {}; leaving", pulled->round);
    return false;
  }
  if (parts_) {
    if (!session_->TakeKeepLocal()) part_leader_->Gather();  // the slices into every rank's parameters
  } else if (!session_->TakeKeepLocal()) {
    trainer_->Load(theta_);
    // The followers get theta from the leader's loaded parameters, on its device (no second host-to-device copy).
    if (leader_) leader_->Load(NamedParameters(*trainer_->model()));
  }
  *round = pulled->round;
  assigned_steps_ = pulled->inner_steps;
  carried_ = StepStats();
  return true;
}

StepStats Worker::Train(int64_t round) {
  // This round's H: the coordinator's (DyLU: whatever this worker's own inner.adaptive_steps says; not with
  // comm.overlap_steps, whose steps of the next round are trained before its H is known) or this worker's
  // inner.steps; the schedule follows the global progress.
  const bool assigned = assigned_steps_ > 0 && config_.comm.overlap_steps == 0;
  const int64_t steps = assigned ? assigned_steps_ : config_.StepsPerSync();
  const int64_t first = ScheduleStart(config_, round, carried_.steps);
  StepStats stats = carried_;
  flags_.training = true;  // a run-complete heartbeat now abandons the round (not comm.overlap_steps' steps)
  {
    absl::Cleanup trained = [this] { flags_.training = false; };  // also when a collective throws mid-round
    stats.Add(TrainSteps(first, steps - carried_.steps));
  }
  carried_ = StepStats();
  return stats;
}

double Worker::PushedNorm(const NamedTensors& delta) const {
  const Codec codec = CodecOf(config_.comm.codec);  // as the client's TensorChunker encodes it
  const int64_t chunk_bytes = std::max<int64_t>(config_.comm.chunk_bytes, kMinChunkBytes);
  const TopkParams topk{config_.comm.topk_chunk, config_.comm.topk_per_chunk};
  const int64_t elements =
      codec == CODEC_TOPK ? TopkChunkElements(chunk_bytes, topk) : ChunkElements(codec, chunk_bytes, sizeof(float));
  double squared = 0;
  for (const auto& [name, d] : delta) {
    const at::Tensor flat = d.contiguous().view({-1});
    const at::Tensor sent = codec == CODEC_RAW    ? flat
                            : codec == CODEC_TOPK ? TopkRoundTrip(flat, topk, elements)
                                                  : RoundTrip(flat, codec, elements);
    squared += sent.to(at::kDouble).square().sum().item<double>();
  }
  return std::sqrt(squared);
}

bool Worker::TrainingStayedFinite(int64_t round, const StepStats& stats) {
  FlatAdamW& optimizer = trainer_->optimizer();
  if (std::isfinite(stats.loss_sum) && std::isfinite(stats.first_loss) && AllFinite(optimizer.flat_parameters())) {
    return true;
  }
  spdlog::warn("round {}: training turned non-finite (loss {}); not pushing, pulling the global model again", round + 1,
               stats.loss_sum / static_cast<double>(std::max<int64_t>(1, stats.steps)));
  // The moments may hold NaN too (a cluster's averaged gradients spread it to every rank): every rank starts them
  // over, bias correction from step 0, so that the ranks step alike again.
  if (leader_) leader_->ResetMoments();
  optimizer.ResetMoments();
  return false;
}

RoundResult Worker::Pack(int64_t round, int f, const StepStats& stats) {
  const int P = plan_.fragments();
  RoundResult result{{}, ReportRound(stats, f, ClusterSize(), trainer_->epochs())};
  if (!parts_) {  // with parts each rank takes its slice's pseudo-gradient as it pushes (PartExchange::PushMine)
    result.pseudo_gradient = trainer_->PseudoGradient(fragment_theta_[static_cast<size_t>(f)], plan_.members(f));
    // With error feedback the push is encoded (topk) and its norm known once, here; the client replays the chunks.
    ErrorFeedback::Sent sent;
    const bool compensated = local_->Compensate(f, result.pseudo_gradient, &sent);
    if (attacker_) {
      attacker_->Apply(result, round);  // changes the pseudo-gradient: encoded again by the client
    } else if (compensated) {
      result.encoded = std::move(sent.chunks);
    }
    if (!options_.dump_delta.empty()) {
      if (absl::Status dumped = DumpDelta(options_.dump_delta, round, result.pseudo_gradient); !dumped.ok()) {
        spdlog::warn("test-only --dump-delta: {}", std::string(dumped.message()));
      }
    }
    result.report.norm = compensated && !attacker_ ? std::sqrt(sent.squared_norm) : PushedNorm(result.pseudo_gradient);
  }
  const RoundReport& r = result.report;
  spdlog::info("round {}{}: {} inner steps, loss {:.4f} -> {:.4f}, lr {:.2e}, {:.0f} tokens/s, {:.2f} s", round + 1,
               P > 1 ? absl::StrCat(" (fragment ", f, "/", P, ")") : std::string(), r.steps, r.first_loss, r.mean_loss,
               r.last_lr, r.tokens / r.seconds, r.seconds);
  return result;
}

std::optional<PullResult> Worker::ExchangeRound(int64_t round, int f, const RoundResult& result) {
  // Push, wait for the round to close and pull the fragment's new global value; with overlap the inner loop goes on
  // for tau steps (the first ones of the next round) meanwhile.
  NamedTensors& incoming = fragment_theta_[static_cast<size_t>(f)];  // not read by the inner loop meanwhile
  // With one fragment, incoming is all of theta_round as pulled: the pull may be the round's sparse update.
  // The round whose theta this worker holds, for a sparse pull of the next round's update (comm.sparse_pulls; the
  // coordinator answers whole where its own setting or the run rules sparse pulls out).
  const int64_t have_round = plan_.fragments() == 1 && config_.comm.sparse_pulls ? round : -1;
  const int64_t overlap_steps = config_.comm.overlap_steps;
  if (overlap_steps == 0) return session_->Exchange(round, result, incoming, have_round);
  std::future<std::optional<PullResult>> exchange =
      std::async(std::launch::async, [&] { return session_->Exchange(round, result, incoming, have_round); });
  try {
    carried_ = TrainSteps(ScheduleStart(config_, round + 1, 0), overlap_steps);
  } catch (...) {  // a collective failed: stop the exchange thread before unwinding
    flags_.failed = true;
    exchange.wait();
    throw;
  }
  return exchange.get();
}

void Worker::SaveLocalState(int64_t round) {
  local_->Save(round);
  if (leader_ && !followers_left_) leader_->Save(round);  // then every follower saves its own
}

void Worker::Apply(int f) {
  if (session_->TakeKeepLocal()) return;  // outer.late_policy reuse_local after a late push: the local ones go on
  if (part_leader_) {                     // every rank's pulled slice to every rank
    part_leader_->Gather();
    return;
  }
  const NamedTensors& incoming = fragment_theta_[static_cast<size_t>(f)];
  const double alpha = config_.comm.overlap_steps > 0 ? config_.comm.merge_alpha : 0.0;
  trainer_->Merge(incoming, plan_.members(f), alpha);
  if (leader_) leader_->Merge(f, alpha, incoming);
}

absl::Status Worker::ShutDown(double started) {
  if (cluster_ && config_.workers.check_replicas) {
    spdlog::info("replica check: parameters identical on all {} ranks after each of {} inner steps", ClusterSize(),
                 cluster_->replica_checks());
  }
  const double wall = Now() - started;
  spdlog::info("compute utilisation: {:.1f}% ({:.1f} s of inner steps in {:.1f} s since joining)",
               wall > 0 ? 100 * compute_seconds_ / wall : 0.0, compute_seconds_, wall);
  const bool stop = flags_.stop, drain = flags_.drain;
  if (stop) spdlog::info("signal received: leaving the run");
  if (drain && !stop) spdlog::info("leaving at the operator's request");
  heartbeat_->Stop();
  const absl::Status outcome = Outcome();
  const WorkerExit code = ExitCodeOf(outcome);
  if (code != kWorkerRefused) {
    session_->Leave(stop                           ? "signal"
                    : drain                        ? "drained by operator"
                    : rank_stopped_                ? "a rank of its cluster stopped"
                    : code == kWorkerClusterFailed ? "its cluster failed"
                    : code == kWorkerFailed        ? "it failed"
                    : code == kWorkerDone          ? "run complete"
                                                   : "error");
  }
  return outcome;
}

StepStats Worker::TrainSteps(int64_t first_step, int64_t n) {
  local_->BeforeFirstStep();
  if (leader_) leader_->Train(first_step, n);
  const double waited = cluster_ ? cluster_->collective_seconds() : 0;
  // A signal acts at the next step, not only once the heartbeat thread (maybe inside a call) turns it into quit.
  StepStats stats = trainer_->TrainSteps(first_step, n, [this] { return flags_.quit || flags_.stop; });
  compute_seconds_ += stats.seconds - ((cluster_ ? cluster_->collective_seconds() : 0) - waited);
  if (stats.abandoned && cluster_) {
    followers_left_ = true;  // they stopped at the same step and left
    // No wish of this rank stopped it: another rank's (a signal to that process).
    if (!flags_.quit && !flags_.stop && !rank_stopped_) {
      rank_stopped_ = true;
      spdlog::info("another rank of this cluster stopped (a signal to it); the cluster leaves the run");
    }
  }
  return stats;
}

}  // namespace diloco
