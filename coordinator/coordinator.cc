#include "coordinator/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/config_loader.h"
#include "config/model_spec.h"
#include "config/text_file.h"
#include "coordinator/bootstrap.h"
#include "coordinator/inner_steps.h"
#include "coordinator/join_check.h"
#include "coordinator/sparse_pull.h"
#include "proto/peer_text.h"
#include "proto/status_json.h"

namespace diloco {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> NamesOf(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> names;
  for (const TensorSpec& spec : specs) names.push_back(spec.name);
  return names;
}

std::string PhaseName(RoundPhase phase) { return std::string(RoundPhaseName(phase)); }

}  // namespace

CoordinatorCore::Model::Model(std::vector<TensorSpec> specs_in, int64_t fragments)
    : specs(std::move(specs_in)),
      fragment_plan(NamesOf(specs), fragments),
      fingerprint(Fingerprint(specs)),
      num_params(TotalElements(specs)) {
  for (int f = 0; f < fragment_plan.fragments(); ++f) {
    std::vector<TensorSpec> members;
    for (size_t i : fragment_plan.members(f)) members.push_back(specs[i]);
    fragment_specs.push_back(std::move(members));
  }
}

CoordinatorCore::CoordinatorCore(const Config& config, std::vector<TensorSpec> specs, std::unique_ptr<ThetaStore> theta,
                                 std::shared_ptr<EvalHistory> evals, Clock clock)
    : config_(config),
      clock_(clock ? std::move(clock) : Clock(SteadySeconds)),
      model_(std::move(specs), config.comm.fragments),
      theta_(std::move(theta)),
      evals_(std::move(evals)),
      accumulator_(model_.specs, config_.comm.topk_average == TopkAverage::kSenders),
      membership_(static_cast<int>(config.workers.count)) {}

CoordinatorCore::~CoordinatorCore() = default;

void CoordinatorCore::AddSinks(std::unique_ptr<Evaluator> evaluator) {
  if (const std::string& dir = config_.coordinator.replay_log_dir; !dir.empty()) {
    sinks_.Add(std::make_unique<ReplayLogSink>(dir, model_.fingerprint, NamesOf(model_.specs)));
  }
  sinks_.Add(std::make_unique<RoundLogSink>(config_.SyncRounds()));
  if (config_.coordinator.eval_every > 0) {
    evaluation_ =
        sinks_.Add(std::make_unique<EvaluationSink>(config_.coordinator.eval_every, std::move(evaluator), evals_));
  }
  checkpoints_ = sinks_.Add(std::make_unique<CheckpointWriter>(
      config_, model_.fingerprint, theta_.get(), evals_,
      [this](int64_t round, CheckpointData& data) { RecordsAt(round, data); }, ConfigHash(config_)));
  sinks_.Add(std::make_unique<SummarySink>([this] { WriteSummary(); }));
}

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(const Config& config, NamedTensors theta_0,
                                                                         std::unique_ptr<Evaluator> evaluator,
                                                                         bool resume, Clock clock) {
  absl::Status s = CheckTheta0(theta_0);
  if (!s.ok()) return s;
  if (config.coordinator.eval_every > 0 && evaluator == nullptr) {
    return absl::InvalidArgumentError("coordinator.eval_every > 0 needs an evaluator");
  }
  std::vector<TensorSpec> specs = SpecsOf(theta_0);
  // Resuming holds theta_0 and the checkpoint's theta and momentum at once: before the accumulator exists, so that
  // the peak stays at 3 copies of the model.
  auto boot = Bootstrap(config, std::move(theta_0), Fingerprint(specs), resume);
  if (!boot.ok()) return boot.status();
  const std::shared_ptr<const ParamSnapshot> snapshot = boot->snapshot;
  std::unique_ptr<ThetaStore> theta = ThetaStore::Create(config, std::move(boot->snapshot), std::move(boot->momentum));
  std::unique_ptr<CoordinatorCore> c(new CoordinatorCore(config, std::move(specs), std::move(theta),
                                                         std::make_shared<EvalHistory>(std::move(boot->evals)),
                                                         std::move(clock)));
  c->AddSinks(std::move(evaluator));
  // Said where the run looks meant for them (topk pushes or an outer step without momentum) but they are off.
  if (const std::string off = SparsePullsOffReason(config);
      !off.empty() && config.comm.sparse_pulls &&
      (config.comm.codec == WireCodec::kTopk || config.outer.momentum == 0)) {
    spdlog::info("sparse pulls off: {}; pulls are dense", off);
  }
  std::shared_ptr<const MomentumAxis> axis = c->ReadMomentumAxis();  // a resumed run's (outer.momentum_bound)
  {
    absl::MutexLock lock(&c->mu_);
    c->axis_ = std::move(axis);
    c->stats_.tokens_committed = boot->tokens_committed;
    c->stats_.bytes_pushed_committed = boot->bytes_pushed_committed;
    c->stats_.dp_equivalent_bytes = boot->dp_equivalent_bytes;
    c->complete_ = snapshot->complete;
    if (c->complete_) c->round_.set_phase(RoundPhase::kComplete);
    c->round_.set_opened_at(c->clock_());
    c->RestoreMembers(boot->members_config, boot->members);
    for (const ThetaIdRecord& earlier : boot->earlier_theta_ids) {
      if (earlier.round < snapshot->round) c->theta_ids_[earlier.round] = earlier.id;
    }
    c->RecordThetaId(*snapshot);
    c->RecordMembersAt(snapshot->round);
  }
  ClosedRound start;
  start.theta = snapshot;
  start.tokens_committed = boot->tokens_committed;
  start.bytes_pushed_committed = boot->bytes_pushed_committed;
  s = c->sinks_.OnStart(start);  // the replay log's theta_0, the evaluation of theta_0
  if (!s.ok()) return s;
  return c;
}

void CoordinatorCore::RecordMembersAt(int64_t round, const RoundState::Pushes* counted) {
  RoundRecords records;
  // With `counted`: the contributions and totals as they will stand once that round commits (credited on copies).
  std::optional<Membership> credited_members;
  RunStats credited = stats_;
  if (counted != nullptr) {
    credited_members.emplace(membership_);
    credited.CreditRound(*counted, model_.num_params, *credited_members);
  }
  const Membership& membership = credited_members ? *credited_members : membership_;
  // Lost members too (a lease that ran out, or restored under a changed config and not joined again): a restart
  // keeps their shard and counted pushes as this process does, not only across one restart.
  for (const auto& [id, m] : membership.members()) {
    if (m.state == MemberState::kLeft) continue;
    int64_t base = m.last_applied_base;
    if (counted != nullptr && counted->count(id) != 0) base = std::max(base, counted->at(id).base);
    records.members.push_back({m.id, m.shard_index, m.shard_reader, m.cluster_size, m.inner_steps, base,
                               m.state == MemberState::kActive, m.rounds_contributed, m.tokens, m.bytes_pushed});
  }
  records.totals = {credited.tokens_committed, credited.bytes_pushed_committed, credited.dp_equivalent_bytes};
  // The thetas of the rounds before `round` that a push may still be computed against (theta_ids_ may hold one more
  // when called before `round`'s theta is recorded).
  for (const auto& [r, id] : theta_ids_) {
    if (r < round && r > round - ThetaIdsKept()) records.earlier_theta_ids.push_back({r, id});
  }
  absl::MutexLock lock(&members_mu_);
  records_at_[round] = std::move(records);
  while (records_at_.size() > 4) records_at_.erase(records_at_.begin());
}

int64_t CoordinatorCore::ThetaIdsKept() const {
  return config_.outer.mode == OuterMode::kAsync ? config_.outer.max_staleness + 1 : 1;
}

void CoordinatorCore::RecordThetaId(const ParamSnapshot& theta) {
  theta_ids_[theta.round] = theta.id;
  while (static_cast<int64_t>(theta_ids_.size()) > ThetaIdsKept()) theta_ids_.erase(theta_ids_.begin());
}

void CoordinatorCore::RecordsAt(int64_t round, CheckpointData& data) const {
  absl::MutexLock lock(&members_mu_);
  const auto it = records_at_.find(round);
  if (it == records_at_.end()) return;
  data.members = it->second.members;
  data.earlier_theta_ids = it->second.earlier_theta_ids;
  data.totals = it->second.totals;
}

void CoordinatorCore::RestoreMembers(const std::string& members_config, const std::vector<MemberRecord>& members) {
  if (members.empty()) return;
  const bool active = members_config == ConfigHash(config_);
  std::vector<std::string> ids;  // the first 8 named in the log line
  size_t lost = 0;               // lost when the checkpoint's round committed: they join again, as after a lease
  for (const MemberRecord& m : members) {
    membership_.Restore(m, clock_(), active && m.active);
    if (!m.active) ++lost;
    if (ids.size() < 8) ids.push_back(Truncated(m.id, 64));
  }
  if (members.size() > ids.size()) ids.push_back(absl::StrCat("and ", members.size() - ids.size(), " more"));
  const std::string lost_text = lost == 0 ? "" : absl::StrCat(" (", lost, " of them lost then: they join again)");
  if (active) {
    spdlog::info(
        "members of the checkpoint: {} ({}){}; a round waits for the active ones as before the restart, and a member "
        "silent for coordinator.lease_s from now is lost",
        members.size(), absl::StrJoin(ids, ", "), lost_text);
  } else {
    spdlog::info(
        "members of the checkpoint: {} ({}){}; the config changed since, so each joins again (its shard and "
        "counted pushes are kept)",
        members.size(), absl::StrJoin(ids, ", "), lost_text);
  }
}

absl::Status CoordinatorCore::CheckMeta(const RequestMeta& meta, bool require_member) const {
  if (absl::Status id = ValidateWorkerId(meta.worker_id()); !id.ok()) return id;
  if (meta.fingerprint() != model_.fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("model fingerprint ", Truncated(meta.fingerprint(), 64),
                                                      " does not match the coordinator's ", model_.fingerprint));
  }
  if (require_member && !membership_.IsActive(meta.worker_id())) {
    return absl::NotFoundError(absl::StrCat("worker '", meta.worker_id(), "' is not an active member; Join again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JoinReply> CoordinatorCore::Join(const JoinRequest& request) {
  const std::string mismatch = ModelMismatch(request.model(), config_.model);
  if (!mismatch.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("model config differs from the coordinator's: ", mismatch));
  }
  if (const std::string data = DataMismatch(request.data(), data_); !data.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("data differs from the coordinator's: ", data));
  }
  if (const int64_t f = std::max(1, request.fragments()); f != config_.comm.fragments) {
    return absl::FailedPreconditionError(
        absl::StrCat("comm.fragments differs: worker has ", f, ", coordinator has ", config_.comm.fragments));
  }
  if (const std::string parts = PushPartsMismatch(config_, request.push_parts()); !parts.empty()) {
    return absl::FailedPreconditionError(parts);
  }
  if (const std::string chunking =
          PushChunkingMismatch(config_, model_.specs, request.push_codec(), request.chunk_bytes());
      !chunking.empty()) {
    return absl::FailedPreconditionError(chunking);
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/false);
  if (!s.ok()) return s;
  if (!membership_.IsActive(request.meta().worker_id()) &&
      static_cast<int64_t>(membership_.active_count()) >= config_.coordinator.max_members) {
    return absl::ResourceExhaustedError(absl::StrCat("the run has ", membership_.active_count(),
                                                     " active members (coordinator.max_members); join later"));
  }
  const bool known = membership_.Find(request.meta().worker_id()) != nullptr;
  const Member& m =
      membership_.Join(request.meta().worker_id(), clock_(), request.has_shard_hint() ? request.shard_hint() : -1,
                       request.has_shard_reader_hint() ? request.shard_reader_hint() : -1);
  membership_.Find(m.id)->cluster_size = std::max(1, request.cluster_size());
  // A member that joins again (its process restarted) starts its pushes in parts afresh: the parts under way go and
  // its attempts are forgotten (a restarted rank 0's clock may be behind the attempts it sent before).
  if (parts_.AttemptOf(m.id).has_value()) DiscardParts(m.id, "the member joined again");
  parts_.Forget(m.id);
  // Likewise its header under a coordinate-wise rule: forgotten before the set is fixed; in a fixed set its push
  // will never finish (the process that declared it is gone), so the aggregation restarts without waiting lease_s.
  if (known && CoordinateWiseRounds()) {
    if (window_.Waits(m.id)) {
      RestartAggregation(m.id, theta_->round(), "the member joined again before its push finished",
                         /*cut_as_stalled=*/false);
    } else {
      window_.Forget(m.id);
    }
  }
  spdlog::info("{} worker {} (shard {}/{}{}, {} threads, {}{}) at round {}", known ? "rejoined:" : "joined:", m.id,
               m.shard_index, membership_.shard_count(),
               m.shard_reader > 0 ? absl::StrCat(" shared, reader ", m.shard_reader) : std::string(), request.threads(),
               Truncated(request.device(), 64),
               m.cluster_size > 1 ? absl::StrCat(", a cluster of ", m.cluster_size) : std::string(),
               theta_->round() + 1);
  cv_.SignalAll();
  JoinReply reply;
  reply.set_round(theta_->round());
  reply.set_rounds_total(config_.SyncRounds());
  reply.set_shard_index(m.shard_index);
  reply.set_shard_count(membership_.shard_count());
  reply.set_shard_reader(m.shard_reader);
  reply.set_heartbeat_interval_ms(static_cast<int64_t>(config_.coordinator.heartbeat_interval_s * 1000));
  reply.set_run_complete(complete_);
  reply.set_push_port(push_port_);
  reply.set_lease_ms(static_cast<int64_t>(config_.coordinator.lease_s * 1000));
  reply.set_max_message_bytes(MaxMessageBytes(config_.comm.chunk_bytes));
  reply.set_chunk_bytes(config_.comm.chunk_bytes);
  reply.set_inner_steps(config_.inner.steps);
  reply.set_fragments(static_cast<int32_t>(config_.comm.fragments));
  *reply.mutable_model() = ModelSpecOf(config_.model);
  return reply;
}

absl::Status CoordinatorCore::Leave(const LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/false);
  if (!s.ok()) return s;
  if (membership_.IsActive(request.meta().worker_id())) {
    membership_.Leave(request.meta().worker_id(), clock_());
    spdlog::info("left: worker {} ({})", request.meta().worker_id(), Truncated(request.reason(), 256));
    cv_.SignalAll();
  }
  return absl::OkStatus();
}

absl::StatusOr<HeartbeatReply> CoordinatorCore::Heartbeat(const HeartbeatRequest& request) {
  HeartbeatRequest at_once = request;  // never held: the answer below comes before this returns
  at_once.set_wait_ms(0);
  absl::StatusOr<HeartbeatReply> out;
  Heartbeat(at_once, [&out](absl::StatusOr<HeartbeatReply> r) { out = std::move(r); });
  return out;
}

void CoordinatorCore::Heartbeat(const HeartbeatRequest& request, HeldHeartbeats::Answer answer) {
  absl::StatusOr<HeartbeatReply> now;
  std::optional<HeldHeartbeats::Held> replaced;
  bool held = false;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = CheckMeta(request.meta(), /*require_member=*/true);
    if (!s.ok()) {
      now = s;
    } else {
      const std::string& id = request.meta().worker_id();
      membership_.Touch(id, clock_());
      HeartbeatReply reply = HeartbeatReplyFor(id);
      const int64_t wait_ms = std::min<int64_t>(request.wait_ms(), kMaxHeartbeatHoldMs);
      held = wait_ms > 0 && !stop_ && Holdable(reply, request.meta().round(), config_.outer.mode == OuterMode::kAsync);
      if (held) {
        replaced = held_.Hold({id, clock_() + static_cast<double>(wait_ms) / 1000, reply, std::move(answer)});
        if (replaced) replaced->reply = std::move(reply);  // the older heartbeat of this worker: answered now
      } else {
        now = std::move(reply);
      }
    }
  }
  if (replaced) replaced->answer(std::move(replaced->reply));
  if (!held) answer(std::move(now));
}

HeartbeatReply CoordinatorCore::HeartbeatReplyFor(const std::string& id) const {
  HeartbeatReply reply;
  reply.set_round(theta_->round());
  reply.set_run_complete(complete_);
  reply.set_pushed(round_.CountsAsPushed(id));
  reply.set_phase(PhaseName(round_.phase()));
  reply.set_push_port(push_port_);
  if (const Member* m = membership_.Find(id)) {
    reply.set_drain(m->drain_requested);
    reply.set_last_applied_base(m->last_applied_base);
    if (m->quarantined_until_round > theta_->round()) reply.set_quarantined_until_round(m->quarantined_until_round);
  }
  return reply;
}

absl::Status CoordinatorCore::Drain(const std::string& worker_id) {
  if (absl::Status id = ValidateWorkerId(worker_id); !id.ok()) return id;
  absl::MutexLock lock(&mu_);
  Member* m = membership_.Find(worker_id);
  if (m == nullptr || m->state != MemberState::kActive) {
    return absl::NotFoundError(absl::StrCat("no active worker '", worker_id, "'"));
  }
  m->drain_requested = true;
  spdlog::info("drain requested for worker {}", worker_id);
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorCore::WrittenCheckpoint> CoordinatorCore::CheckpointNow() { return checkpoints_->Write(); }

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> CoordinatorCore::BeginPull(const PullRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  if (request.has_fragment() && (request.fragment() < 0 || request.fragment() >= fragments())) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of fragment ", request.fragment(), ": comm.fragments is ", fragments()));
  }
  if (request.has_range()) {  // a pull in parts: a range of the (fragment's) flat buffer
    int64_t numel = 0;
    for (const TensorSpec& spec : request.has_fragment() ? fragment_specs(request.fragment()) : model_.specs) {
      numel += spec.numel();
    }
    const ElementRange& r = request.range();
    if (r.begin() < 0 || r.end() < r.begin() || r.end() > numel) {
      return absl::InvalidArgumentError(absl::StrCat("pull of range [", r.begin(), ", ", r.end(),
                                                     ") refused: not within the ", numel, " elements pulled"));
    }
  }
  membership_.Touch(request.meta().worker_id(), clock_());
  std::shared_ptr<const ParamSnapshot> current = theta_->current();
  if (current->complete && !complete_) {
    // The run's last theta is served once its checkpoint is on disk (or failed): a worker that pulls it is told the
    // run is complete and leaves, and a coordinator killed before that checkpoint would resume at the round before
    // with nobody left to train it, and the last theta lost.
    return absl::UnavailableError("the run's last round is being checkpointed; pull again");
  }
  return current;
}

void CoordinatorCore::CountBytesSent(const std::string& worker_id, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  stats_.bytes_sent += bytes;
  if (Member* m = membership_.Find(worker_id)) m->bytes_pulled += bytes;
}

int64_t CoordinatorCore::InnerStepsFor(const std::string& worker_id) const {
  if (!config_.inner.adaptive_steps) return 0;  // the worker trains its own inner.steps
  absl::MutexLock lock(&mu_);
  const Member* m = membership_.members().count(worker_id) ? &membership_.members().at(worker_id) : nullptr;
  return m != nullptr && m->inner_steps > 0 ? m->inner_steps : config_.inner.steps;
}

}  // namespace diloco
