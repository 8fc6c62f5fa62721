#include "coordinator/coordinator.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "config/text_file.h"
#include "coordinator/inner_steps.h"
#include "proto/status_json.h"
#include "worker/lm/evaluate.h"
#include "proto/fragment_plan.h"
#include "worker/lm/token_data.h"
#include "worker/lm/transformer.h"

namespace diloco {

// Holds a model instance and the validation split; evaluates a theta. Used by the round thread only.
class Evaluator {
 public:
  Evaluator(TransformerLM model, TokenData val, int64_t batches, int64_t batch_size)
      : model_(std::move(model)), val_(std::move(val)), batches_(batches), batch_size_(batch_size) {}
  double Evaluate(const std::vector<std::pair<std::string, at::Tensor>>& theta) {
    LoadParameters(*model_, theta);
    return EvaluateLoss(model_, val_, batches_, batch_size_);
  }

 private:
  TransformerLM model_;
  TokenData val_;
  int64_t batches_, batch_size_;
};

namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string ModelMismatch(const ModelSpec& w, const ModelConfig& c) {
  std::vector<std::string> diffs;
  auto check = [&](const char* key, int64_t worker, int64_t coordinator) {
    if (worker != coordinator) {
      diffs.push_back(absl::StrCat("model.", key, ": worker has ", worker, ", coordinator has ", coordinator));
    }
  };
  check("vocab_size", w.vocab_size(), c.vocab_size);
  check("seq_len", w.seq_len(), c.seq_len);
  check("n_layer", w.n_layer(), c.n_layer);
  check("n_head", w.n_head(), c.n_head);
  check("d_model", w.d_model(), c.d_model);
  std::string out;
  for (const std::string& d : diffs) absl::StrAppend(&out, out.empty() ? "" : "; ", d);
  return out;
}

}  // namespace

CoordinatorCore::CoordinatorCore(const Config& config, Clock clock)
    : config_(config),
      clock_(clock ? std::move(clock) : Clock(SteadySeconds)),
      outer_(config.outer.optimizer, config.outer.lr, config.outer.momentum),
      accumulator_({}),
      membership_(static_cast<int>(config.workers.count)) {}

CoordinatorCore::~CoordinatorCore() = default;

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(const Config& config, const TokenCache& cache,
                                                                         bool resume, Clock clock) {
  std::unique_ptr<CoordinatorCore> c(new CoordinatorCore(config, std::move(clock)));
  TransformerLM model = MakeTransformerLM(config.model, config.run.seed);
  auto snapshot = std::make_shared<ParamSnapshot>();
  for (const auto& [name, p] : NamedParameters(*model)) snapshot->params.emplace_back(name, p.detach().clone());
  c->specs_ = SpecsOf(snapshot->params);
  c->fingerprint_ = Fingerprint(c->specs_);
  c->num_params_ = TotalElements(c->specs_);
  std::vector<std::string> names;
  for (const TensorSpec& spec : c->specs_) names.push_back(spec.name);
  c->fragment_plan_ = FragmentPlan(names, config.comm.fragments);
  for (int f = 0; f < c->fragment_plan_.fragments(); ++f) {
    const std::vector<size_t>& members = c->fragment_plan_.members(f);
    std::vector<TensorSpec> specs;
    for (size_t i : members) specs.push_back(c->specs_[i]);
    c->fragment_specs_.push_back(std::move(specs));
  }

  if (!config.model.init_from.empty()) {
    auto ckpt = LoadCheckpoint(config.model.init_from);
    if (!ckpt.ok()) return absl::Status(ckpt.status().code(), absl::StrCat("model.init_from: ", ckpt.status().message()));
    if (ckpt->fingerprint != c->fingerprint_) {
      return absl::FailedPreconditionError(absl::StrCat("model.init_from ", config.model.init_from, ": fingerprint ",
                                                        ckpt->fingerprint, " does not match model: (",
                                                        c->fingerprint_, "); use a checkpoint of the same model"));
    }
    snapshot->params = std::move(ckpt->params);
    spdlog::info("theta_0 from {} (a round-{} checkpoint)", config.model.init_from, ckpt->round);
  }
  c->accumulator_ = RoundAccumulator(c->specs_);
  if (config.outer.mode == OuterMode::kAsync && config.outer.optimizer == OuterOptimizerKind::kNesterov) {
    const int64_t n = config.outer.delay_n > 0 ? config.outer.delay_n : config.workers.count;
    c->dn_ = std::make_unique<DelayedNesterov>(config.outer.lr, config.outer.momentum, n);
    spdlog::info("asynchronous rounds: Delayed Nesterov, momentum every {} pushes; max staleness {} versions", n,
                 config.outer.max_staleness);
  }

  auto val = TokenData::Load(cache.val_path(), config.model.seq_len);
  if (!val.ok()) return val.status();
  c->evaluator_ = std::make_unique<Evaluator>(std::move(model), std::move(*val), config.coordinator.eval_batches,
                                              config.inner.batch_size);
  if (resume) {
    std::vector<std::string> skipped;
    auto loaded = LoadNewestCheckpoint(config.CheckpointDir(), &skipped);
    for (const std::string& why : skipped) spdlog::warn("skipping checkpoint: {}", why);
    if (loaded.ok()) {
      if (loaded->data.fingerprint != c->fingerprint_) {
        return absl::FailedPreconditionError(
            absl::StrCat("coordinator.checkpoint_dir: ", loaded->path, " is a checkpoint of another model (fingerprint ",
                         loaded->data.fingerprint, ", this model ", c->fingerprint_,
                         "); start with --fresh or set another checkpoint_dir"));
      }
      snapshot->params = std::move(loaded->data.params);
      snapshot->round = loaded->data.round;
      snapshot->complete = snapshot->round >= config.SyncRounds();
      c->momentum_snapshot_ = loaded->data.momentum;
      if (c->dn_) {
        c->dn_->set_momentum_buffers(std::move(loaded->data.momentum));
      } else {
        c->outer_.set_momentum_buffers(std::move(loaded->data.momentum));
      }
      c->evals_ = std::move(loaded->data.evals);
      if (!c->evals_.empty() && c->evals_.back().round == snapshot->round) {  // the totals go on from the checkpoint
        c->tokens_committed_ = c->evals_.back().tokens;
        c->bytes_pushed_committed_ = c->evals_.back().bytes_pushed_committed;
      }
      c->complete_ = snapshot->complete;
      if (c->complete_) {
        c->phase_ = "complete";
        spdlog::warn("the run in {} is already complete (round {} of {}); nothing to train. Start over "
                     "with --fresh, or raise outer.rounds to continue it", config.CheckpointDir(), snapshot->round,
                     config.SyncRounds());
      }
      spdlog::info("resumed from {}: round {}, {} evals{}", loaded->path, snapshot->round, c->evals_.size(),
                   skipped.empty() ? "" : absl::StrCat(" (", skipped.size(), " newer file(s) skipped as corrupt)"));
    } else if (!skipped.empty()) {
      spdlog::warn("no valid checkpoint to resume from in {}; starting from theta_0", config.CheckpointDir());
    }
  }
  c->snapshot_ = snapshot;
  c->round_opened_at_ = c->clock_();
  if (config.coordinator.eval_every > 0 && c->evals_.empty()) c->EvaluateIfDue(*snapshot, /*force=*/true);
  return c;
}

absl::Status CoordinatorCore::CheckMeta(const RequestMeta& meta, bool require_member) const {
  if (meta.worker_id().empty()) return absl::InvalidArgumentError("request without a worker id");
  if (meta.fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat("model fingerprint ", meta.fingerprint(),
                                                      " does not match the coordinator's ", fingerprint_));
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
  if (const int64_t f = std::max(1, request.fragments()); f != config_.comm.fragments) {
    return absl::FailedPreconditionError(absl::StrCat("comm.fragments differs: worker has ", f, ", coordinator has ",
                                                      config_.comm.fragments));
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/false);
  if (!s.ok()) return s;
  const bool known = membership_.Find(request.meta().worker_id()) != nullptr;
  const Member& m = membership_.Join(request.meta().worker_id(), clock_(),
                                     request.has_shard_hint() ? request.shard_hint() : -1);
  membership_.Find(m.id)->cluster_size = std::max(1, request.cluster_size());
  spdlog::info("{} worker {} (shard {}/{}, {} threads, {}{}) at round {}", known ? "rejoined:" : "joined:", m.id,
               m.shard_index, membership_.shard_count(), request.threads(), request.device(),
               m.cluster_size > 1 ? absl::StrCat(", a cluster of ", m.cluster_size) : std::string(),
               snapshot_->round);
  cv_.notify_all();
  JoinReply reply;
  reply.set_round(snapshot_->round);
  reply.set_rounds_total(config_.SyncRounds());
  reply.set_shard_index(m.shard_index);
  reply.set_shard_count(membership_.shard_count());
  reply.set_heartbeat_interval_ms(static_cast<int64_t>(config_.coordinator.heartbeat_interval_s * 1000));
  reply.set_run_complete(complete_);
  reply.set_push_port(push_port_);
  return reply;
}

absl::Status CoordinatorCore::Leave(const LeaveRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/false);
  if (!s.ok()) return s;
  if (membership_.IsActive(request.meta().worker_id())) {
    membership_.Leave(request.meta().worker_id());
    spdlog::info("left: worker {} ({})", request.meta().worker_id(), request.reason());
    cv_.notify_all();
  }
  return absl::OkStatus();
}

absl::StatusOr<HeartbeatReply> CoordinatorCore::Heartbeat(const HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  membership_.Touch(request.meta().worker_id(), clock_());
  HeartbeatReply reply;
  reply.set_round(snapshot_->round);
  reply.set_run_complete(complete_);
  reply.set_pushed(pushed_.count(request.meta().worker_id()) != 0 || closing_.count(request.meta().worker_id()) != 0);
  reply.set_phase(phase_);
  if (const Member* m = membership_.Find(request.meta().worker_id())) reply.set_drain(m->drain_requested);
  return reply;
}

absl::Status CoordinatorCore::Drain(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Member* m = membership_.Find(worker_id);
  if (m == nullptr || m->state != MemberState::kActive) {
    return absl::NotFoundError(absl::StrCat("no active worker '", worker_id, "'"));
  }
  m->drain_requested = true;
  spdlog::info("drain requested for worker {}", worker_id);
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorCore::WrittenCheckpoint> CoordinatorCore::CheckpointNow() { return WriteCheckpoint(); }

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> CoordinatorCore::BeginPull(const PullRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckMeta(request.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  if (request.has_fragment() && (request.fragment() < 0 || request.fragment() >= fragments())) {
    return absl::InvalidArgumentError(absl::StrCat("pull of fragment ", request.fragment(), ": comm.fragments is ",
                                                   fragments()));
  }
  membership_.Touch(request.meta().worker_id(), clock_());
  return snapshot_;
}

void CoordinatorCore::CountBytesSent(const std::string& worker_id, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_sent_ += bytes;
  if (Member* m = membership_.Find(worker_id)) m->bytes_pulled += bytes;
}

int64_t CoordinatorCore::InnerStepsFor(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Member* m = membership_.members().count(worker_id) ? &membership_.members().at(worker_id) : nullptr;
  return m != nullptr && m->inner_steps > 0 ? m->inner_steps : config_.inner.steps;
}

absl::StatusOr<PushTicket> CoordinatorCore::BeginPush(const PushHeader& header) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckMeta(header.meta(), /*require_member=*/true);
  if (!s.ok()) return s;
  const std::string& id = header.meta().worker_id();
  if (const Member* m = membership_.Find(id); m != nullptr && clock_() - m->last_seen > config_.coordinator.lease_s) {
    // Silent past its lease (the round loop marks it lost at its next pass): it must join again before it counts.
    return absl::NotFoundError(absl::StrCat("worker '", id, "' lease expired (silent for ", clock_() - m->last_seen,
                                            " s > coordinator.lease_s ", config_.coordinator.lease_s,
                                            "); Join again"));
  }
  if (complete_) return absl::FailedPreconditionError("the run is complete");
  if (async()) {
    if (phase_ != "training") {
      return absl::UnavailableError(absl::StrCat("the global model is being stepped to version ", snapshot_->round + 1,
                                                 "; retry"));
    }
    const int64_t behind = snapshot_->round - header.meta().round();
    if (behind < 0 || behind > config_.outer.max_staleness) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push computed against version ", header.meta().round(), " refused: the global model is at version ",
          snapshot_->round, " (", behind, " behind; outer.max_staleness is ", config_.outer.max_staleness,
          "); pull the current parameters"));
    }
  } else if (header.meta().round() != snapshot_->round || phase_ != "training") {
    return absl::FailedPreconditionError(absl::StrCat("push for round ", header.meta().round(),
                                                      " refused: the open round is based on round ", snapshot_->round,
                                                      " (phase ", phase_, "); pull the current parameters"));
  }
  if (pushed_.count(id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' already pushed for round ", snapshot_->round));
  }
  if (streaming_.count(id) != 0) {  // e.g. a retry while the first stream is still open: never count a worker twice
    return absl::UnavailableError(
        absl::StrCat("a push from worker '", id, "' for round ", snapshot_->round, " is still streaming; retry later"));
  }
  if (header.tokens() <= 0 || header.tokens() > (int64_t{1} << 40) || header.inner_steps() < 0 ||
      header.inner_steps() > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("push header: tokens (", header.tokens(), ") must be in [1, 2^40]",
                                                   " and inner_steps (", header.inner_steps(), ") in [0, 2^31]"));
  }
  if (!std::isfinite(header.loss()) || !std::isfinite(header.seconds()) || header.seconds() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("push header: loss (", header.loss(), ") must be finite and ",
                                                   "seconds (", header.seconds(), ") finite and >= 0"));
  }
  const int fragment = static_cast<int>(snapshot_->round % fragments());
  if (header.fragment() != fragment) {
    return absl::InvalidArgumentError(absl::StrCat("push of fragment ", header.fragment(), " refused: round ",
                                                   snapshot_->round + 1, " syncs fragment ", fragment, " of ",
                                                   fragments()));
  }
  membership_.Touch(id, clock_());
  streaming_.insert(id);
  PushTicket t;
  t.worker_id = id;
  t.round = snapshot_->round;
  t.fragment = fragment;
  t.epoch = epoch_;
  t.weight = static_cast<double>(header.tokens());
  t.tokens = header.tokens();
  t.inner_steps = header.inner_steps();
  t.loss = header.loss();
  t.seconds = header.seconds();
  return t;
}

absl::Status CoordinatorCore::FoldChunk(PushTicket& ticket, size_t index, int64_t offset, const at::Tensor& values,
                                        int64_t wire_bytes) {
  if (wire_bytes < 0) wire_bytes = values.numel() * values.element_size();
  if (index >= specs_.size() || offset < 0 || offset + values.numel() > specs_[index].numel()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk outside the model: tensor ", index, " elements [", offset,
                                                   ", ", offset + values.numel(), ")"));
  }
  if (!AllFinite(values)) {
    return absl::InvalidArgumentError(absl::StrCat("pseudo-gradient of '", specs_[index].name,
                                                   "' holds NaN or Inf near element ", offset, "; push refused"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (ticket.round != snapshot_->round || phase_ != "training") {
    return absl::FailedPreconditionError(absl::StrCat("round ", ticket.round, " closed while the push was streaming"));
  }
  if (ticket.epoch != epoch_) {
    return absl::AbortedError("the round's aggregation restarted after a broken push; push again");
  }
  accumulator_.Fold(index, offset, values, ticket.weight);
  ticket.folded_any = true;
  partial_.insert(ticket.worker_id);
  ticket.bytes += wire_bytes;
  bytes_received_ += wire_bytes;
  return absl::OkStatus();
}

absl::Status CoordinatorCore::CommitPush(PushTicket& ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ticket.finished) {
    streaming_.erase(ticket.worker_id);
    partial_.erase(ticket.worker_id);
  }
  ticket.finished = true;
  if (ticket.round != snapshot_->round || phase_ != "training") {
    return absl::FailedPreconditionError(absl::StrCat("round ", ticket.round, " closed before the push completed"));
  }
  if (ticket.epoch != epoch_) return absl::AbortedError("the round's aggregation restarted; push again");
  accumulator_.AddContribution(ticket.weight);
  pushed_[ticket.worker_id] = ticket;
  if (Member* m = membership_.Find(ticket.worker_id)) {
    m->last_loss = ticket.loss;
    m->last_tokens_per_s = ticket.seconds > 0 ? ticket.tokens / ticket.seconds : 0;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void CoordinatorCore::AbortPush(PushTicket& ticket, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ticket.finished) return;
  ticket.finished = true;
  streaming_.erase(ticket.worker_id);
  partial_.erase(ticket.worker_id);
  if (!ticket.folded_any || ticket.epoch != epoch_ || ticket.round != snapshot_->round) return;
  // Some of this push is in the sums and the rest never came: discard the round's aggregation so far.
  accumulator_.Reset();
  partial_.clear();  // every other push in flight was folded under the old epoch and must start over
  ++epoch_;
  spdlog::warn("push from {} for round {} broke off ({}); restarting the round's aggregation, {} worker(s) push again",
               ticket.worker_id, ticket.round, why, pushed_.size());
  pushed_.clear();
}

StatusReply CoordinatorCore::Status() const {
  std::lock_guard<std::mutex> lock(mu_);
  StatusReply s;
  s.set_run_name(config_.run.name);
  s.set_round(snapshot_->round);
  s.set_rounds_total(config_.SyncRounds());
  s.set_fragments(fragments());
  s.set_phase(phase_);
  s.set_phase_reason(phase_reason_);
  s.set_params(num_params_);
  s.set_fingerprint(fingerprint_);
  s.set_bytes_received(bytes_received_);
  s.set_bytes_sent(bytes_sent_);
  s.set_last_round_seconds(last_round_seconds_);
  s.set_last_outer_step_seconds(last_outer_step_seconds_);
  s.set_bytes_pushed_committed(bytes_pushed_committed_);
  s.set_dp_equivalent_bytes(dp_equivalent_bytes_);
  s.set_last_round_bytes_pushed(last_round_bytes_pushed_);
  const double now = clock_();
  for (const auto& [id, m] : membership_.members()) {
    WorkerStatus* w = s.add_workers();
    w->set_id(id);
    w->set_state(MemberStateName(m.state));
    w->set_rounds_contributed(m.rounds_contributed);
    w->set_tokens(m.tokens);
    w->set_last_loss(m.last_loss);
    w->set_heartbeat_age_s(now - m.last_seen);
    w->set_shard_index(m.shard_index);
    w->set_tokens_per_s(m.last_tokens_per_s);
    w->set_bytes_pushed(m.bytes_pushed);
    w->set_bytes_pulled(m.bytes_pulled);
    w->set_pushed_this_round(pushed_.count(id) != 0);
    w->set_cluster_size(m.cluster_size);
    w->set_inner_steps(m.inner_steps > 0 ? m.inner_steps : config_.inner.steps);
  }
  for (const EvalRecord& e : evals_) {
    EvalPoint* p = s.add_evals();
    p->set_round(e.round);
    p->set_val_loss(e.val_loss);
    p->set_tokens(e.tokens);
    p->set_bytes_pushed_committed(e.bytes_pushed_committed);
  }
  return s;
}

void CoordinatorCore::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !complete_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    RoundLoopPass(lock);
  }
}

void CoordinatorCore::Poll() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stop_ && !complete_) RoundLoopPass(lock);
}

void CoordinatorCore::RoundLoopPass(std::unique_lock<std::mutex>& lock) {
  const RoundPolicyOptions options{config_.coordinator.min_workers, config_.coordinator.round_timeout_s};
  const double now = clock_();
  for (const std::string& id : membership_.ExpireLeases(now, config_.coordinator.lease_s)) {
    spdlog::warn("lost: worker {} (no heartbeat for {} s)", id, config_.coordinator.lease_s);
  }
  std::set<std::string> pushed;
  for (const auto& [id, ticket] : pushed_) pushed.insert(id);
  RoundDecision decision;
  if (async()) {  // apply what has arrived, once no other push is half in the sums
    decision.close = !pushed_.empty() && streaming_.empty();
    decision.reason = pushed_.empty() ? "async: waiting for a push"
                      : decision.close ? absl::StrCat("async: ", pushed_.size(), " push(es) arrived")
                                       : absl::StrCat("async: waiting for ", streaming_.size(), " push stream(s)");
    phase_reason_ = decision.reason;  // changes with every push: not logged
  } else {
    decision = DecideRoundClose({membership_.ActiveIds(), pushed, round_opened_at_}, now, options);
  }
  if (decision.close && !partial_.empty()) {  // never close over chunks of a push that has not committed
    decision = {false, absl::StrCat("ready to close; waiting for ", partial_.size(), " push stream(s) in flight")};
  }
  if (decision.reason != phase_reason_) {
    phase_reason_ = decision.reason;
    if (!decision.close) spdlog::info("round {}: {}", snapshot_->round + 1, decision.reason);
  }
  if (!decision.close) return;
  ClosingRound closing = BeginClose();  // under the same lock as the decision
  lock.unlock();
  try {
    FinishClose(std::move(closing), decision.reason);
  } catch (const std::exception& e) {  // a failed round is discarded, not fatal
    spdlog::error("round {} discarded: {}; its workers push again", snapshot_->round + 1, e.what());
    lock.lock();
    closing_.clear();
    phase_ = "training";
    return;
  }
  lock.lock();
}

CoordinatorCore::ClosingRound CoordinatorCore::BeginClose() {
  ClosingRound c;
  phase_ = "stepping";
  c.base = snapshot_;
  c.tokens = accumulator_.total_weight();
  c.delta = accumulator_.TakeAverage(std::move(spare_sums_));
  c.contributors.swap(pushed_);
  for (const auto& [id, push] : c.contributors) closing_.insert(id);  // heartbeats still say "pushed"
  ++epoch_;
  if (previous_snapshot_ && previous_snapshot_.use_count() == 1) {  // no pull reads theta_{t-1} any more
    for (const auto& [name, p] : previous_snapshot_->params) c.recycle.push_back(p);
  }
  previous_snapshot_.reset();
  return c;
}

void CoordinatorCore::FinishClose(ClosingRound closing, const std::string& reason) {
  std::shared_ptr<const ParamSnapshot>& base = closing.base;
  std::vector<at::Tensor>& delta = closing.delta;
  const auto& contributors = closing.contributors;
  const double tokens = closing.tokens;
  for (const at::Tensor& d : delta) {
    if (!AllFinite(d)) throw std::runtime_error("the averaged pseudo-gradient is not finite");
  }
  const double t0 = clock_();
  std::vector<at::Tensor> theta;
  for (const auto& [name, p] : base->params) theta.push_back(p);
  const std::vector<size_t>* only =
      fragments() > 1 ? &fragment_plan_.members(fragment_plan_.FragmentOfRound(base->round)) : nullptr;
  std::vector<at::Tensor> next =
      dn_ ? dn_->Step(theta, delta) : outer_.Step(theta, delta, std::move(closing.recycle), only);
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->round = base->round + 1;
  snapshot->complete = snapshot->round >= config_.SyncRounds();
  for (size_t i = 0; i < next.size(); ++i) snapshot->params.emplace_back(base->params[i].first, next[i]);
  const double t1 = clock_();
  for (at::Tensor& d : delta) d.zero_();  // the next round's accumulator
  {
    std::lock_guard<std::mutex> lock(mu_);
    spare_sums_ = std::move(delta);
    closing_.clear();
    const double k = static_cast<double>(contributors.size());
    last_round_bytes_pushed_ = 0;
    for (const auto& [id, push] : contributors) {  // credited only once the round is committed
      if (Member* m = membership_.Find(id)) {
        ++m->rounds_contributed;
        m->tokens += push.tokens;
        m->bytes_pushed += push.bytes;
        if (push.seconds > 0) m->steps_per_s = static_cast<double>(push.inner_steps) / push.seconds;
      }
      tokens_committed_ += push.tokens;
      last_round_bytes_pushed_ += push.bytes;
      dp_equivalent_bytes_ += static_cast<int64_t>(push.inner_steps * 2.0 * (k - 1) / k * 4.0 * num_params_);
    }
    bytes_pushed_committed_ += last_round_bytes_pushed_;
    if (config_.inner.adaptive_steps) {  // DyLU: next round's H of every active worker from its measured speed
      std::map<std::string, double> speeds;
      for (const std::string& id : membership_.ActiveIds()) speeds[id] = membership_.Find(id)->steps_per_s;
      for (const auto& [id, h] : AssignInnerSteps(speeds, config_.inner.steps)) {
        Member* m = membership_.Find(id);
        if (m->inner_steps != h) spdlog::info("DyLU: worker {} trains {} inner steps per round ({:.1f} steps/s)", id, h, m->steps_per_s);
        m->inner_steps = h;
      }
    }
    last_outer_step_seconds_ = t1 - t0;
    last_round_seconds_ = t1 - round_opened_at_;
    round_opened_at_ = t1;
    previous_snapshot_ = snapshot_;
    snapshot_ = snapshot;
    momentum_snapshot_ = dn_ ? dn_->momentum_buffers() : outer_.momentum_buffers();
    phase_ = snapshot->complete ? "finishing" : "training";
    phase_reason_.clear();
  }
  spdlog::info("round {}/{} closed ({}): {} pushes, {:.0f} tokens, outer step {:.3f} s, round {:.2f} s",
               snapshot->round, config_.SyncRounds(), reason, contributors.size(), tokens, t1 - t0,
               last_round_seconds_);
  EvaluateIfDue(*snapshot, snapshot->complete);
  CheckpointIfDue(snapshot->complete);
  if (snapshot->complete) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      complete_ = true;
      phase_ = "complete";
      cv_.notify_all();
    }
    WriteSummary();
  }
}

void CoordinatorCore::EvaluateIfDue(const ParamSnapshot& snapshot, bool force) {
  const int64_t every = config_.coordinator.eval_every;
  if (every <= 0 || (!force && snapshot.round % every != 0)) return;
  const double t0 = clock_();
  double loss = 0;
  try {
    loss = evaluator_->Evaluate(snapshot.params);
  } catch (const std::exception& e) {
    spdlog::error("evaluation of round {} failed, training goes on: {}", snapshot.round, e.what());
    return;
  }
  spdlog::info("eval: round {} val_loss {:.4f} (ppl {:.2f}, {:.2f} s)", snapshot.round, loss, std::exp(loss),
               clock_() - t0);
  std::lock_guard<std::mutex> lock(mu_);
  evals_.push_back({snapshot.round, loss, tokens_committed_, bytes_pushed_committed_});
}

void CoordinatorCore::CheckpointIfDue(bool force) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t every = config_.coordinator.checkpoint_every;
    if (!force && (every <= 0 || snapshot_->round % every != 0)) return;
  }
  auto path = WriteCheckpoint();
  if (!path.ok()) spdlog::error("checkpoint failed, training goes on: {}", std::string(path.status().message()));
}

absl::StatusOr<CoordinatorCore::WrittenCheckpoint> CoordinatorCore::WriteCheckpoint() {
  std::lock_guard<std::mutex> writing(checkpoint_mu_);
  CheckpointData data;
  {
    std::lock_guard<std::mutex> lock(mu_);
    data.round = snapshot_->round;
    data.params = snapshot_->params;
    data.evals = evals_;
    data.momentum = momentum_snapshot_;  // published together with theta_t; never modified in place
  }
  data.fingerprint = fingerprint_;
  const std::string path = CheckpointPath(config_.CheckpointDir(), data.round);
  absl::Status s = SaveCheckpoint(path, data);
  if (!s.ok()) return s;
  PruneCheckpoints(config_.CheckpointDir(), config_.coordinator.keep_checkpoints);
  spdlog::info("checkpoint: {} (round {})", path, data.round);
  return WrittenCheckpoint{path, data.round};
}

void CoordinatorCore::WriteSummary() const {
  const absl::Status s =
      WriteTextFileAtomically(config_.run.output_dir + "/summary.json", StatusToJson(Status()).dump(2) + "\n");
  if (!s.ok()) spdlog::error("{}", std::string(s.message()));
}

void CoordinatorCore::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

bool CoordinatorCore::complete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return complete_;
}

void CoordinatorCore::WaitForWorkersToLeave(double timeout_s) {
  const double deadline = clock_() + timeout_s;
  std::unique_lock<std::mutex> lock(mu_);
  // Also wait for workers that have not joined yet (a run resumed already complete): they must learn that it is
  // over, or they would retry until workers.connect_timeout_s.
  auto done = [&] {
    return membership_.ActiveIds().empty() &&
           static_cast<int64_t>(membership_.members().size()) >= config_.workers.count;
  };
  while (!stop_ && !done() && clock_() < deadline) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

}  // namespace diloco
