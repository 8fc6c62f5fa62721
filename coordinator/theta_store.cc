#include "coordinator/theta_store.h"

#include <utility>

namespace diloco {
namespace {

std::vector<at::Tensor> TensorsOf(const NamedTensors& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const auto& [name, p] : params) out.push_back(p);
  return out;
}

// The next version's snapshot header: round + 1, complete once it reaches the run's last round.
std::shared_ptr<ParamSnapshot> NextOf(const ParamSnapshot& base, int64_t rounds_total) {
  auto next = std::make_shared<ParamSnapshot>();
  next->round = base.round + 1;
  next->complete = next->round >= rounds_total;
  return next;
}

// Synchronous rounds: one copy of theta, stepped in place under the guard (theta_store.h).
class SyncThetaStore : public ThetaStore {
 public:
  SyncThetaStore(const Config& config, std::shared_ptr<ParamSnapshot> theta)
      : ThetaStore(config, theta), guard_(std::make_shared<ThetaGuard>()) {
    absl::MutexLock lock(&guard_->mu);
    guard_->round = theta->round;
    theta->guard = guard_;
  }

  std::shared_ptr<ParamSnapshot> Step(const std::vector<at::Tensor>& delta, const std::vector<size_t>* only) override {
    const std::shared_ptr<const ParamSnapshot> base = current();
    std::shared_ptr<ParamSnapshot> next = NextOf(*base, rounds_total_);
    next->guard = guard_;
    next->params = base->params;            // the same tensors, which now hold theta_{t+1}
    absl::MutexLock stepping(&guard_->mu);  // pulls and checkpoints of theta_t wait, then find it moved on
    outer_step_->StepInPlace(TensorsOf(base->params), delta, only);
    guard_->round = next->round;
    return next;
  }

  void Publish(std::shared_ptr<const ParamSnapshot> next) override {
    absl::MutexLock lock(&mu_);
    current_ = std::move(next);
  }

  // No step runs while the guard is held shared, and the round is the one the tensors hold (a step may have
  // finished before its snapshot was published).
  absl::Status ReadSteady(const std::function<absl::Status(const SteadyTheta&)>& read) override {
    absl::ReaderMutexLock steady(&guard_->mu);
    const std::shared_ptr<const ParamSnapshot> theta = current();
    return read({guard_->round, theta->params, outer_step_->momentum_buffers()});
  }

 private:
  const std::shared_ptr<ThetaGuard> guard_;  // the round the tensors hold; shared with every snapshot
};

// Asynchronous rounds: versioned immutable snapshots (theta_store.h).
class AsyncThetaStore : public ThetaStore {
 public:
  AsyncThetaStore(const Config& config, std::shared_ptr<ParamSnapshot> theta, std::vector<at::Tensor> momentum)
      : ThetaStore(config, std::move(theta)), momentum_(std::move(momentum)) {}

  std::shared_ptr<ParamSnapshot> Step(const std::vector<at::Tensor>& delta, const std::vector<size_t>* only) override {
    std::shared_ptr<const ParamSnapshot> base;
    std::vector<at::Tensor> recycle;
    {
      absl::MutexLock lock(&mu_);
      base = current_;
      if (previous_ && previous_.use_count() == 1) recycle = TensorsOf(previous_->params);  // no pull reads it
      previous_.reset();
    }
    std::shared_ptr<ParamSnapshot> next = NextOf(*base, rounds_total_);
    std::vector<at::Tensor> stepped = outer_step_->Step(TensorsOf(base->params), delta, std::move(recycle), only);
    for (size_t i = 0; i < stepped.size(); ++i) next->params.emplace_back(base->params[i].first, stepped[i]);
    return next;
  }

  void Publish(std::shared_ptr<const ParamSnapshot> next) override {
    absl::MutexLock lock(&mu_);
    previous_ = std::move(current_);
    momentum_ = outer_step_->momentum_buffers();  // never modified in place once returned (outer_step.h)
    current_ = std::move(next);
  }

  absl::Status ReadSteady(const std::function<absl::Status(const SteadyTheta&)>& read) override {
    std::shared_ptr<const ParamSnapshot> theta;
    std::vector<at::Tensor> momentum;
    {
      absl::MutexLock lock(&mu_);
      theta = current_;
      momentum = momentum_;
    }
    return read({theta->round, theta->params, momentum});
  }

 private:
  // theta_{t-1}, whose memory the next step reuses when no pull holds it.
  std::shared_ptr<const ParamSnapshot> previous_ ABSL_GUARDED_BY(mu_);
  // The outer momentum after the step that produced current_.
  std::vector<at::Tensor> momentum_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

ThetaStore::ThetaStore(const Config& config, std::shared_ptr<const ParamSnapshot> theta)
    : rounds_total_(config.SyncRounds()), outer_step_(MakeOuterStep(config)), current_(std::move(theta)) {}

std::unique_ptr<ThetaStore> ThetaStore::Create(const Config& config, std::shared_ptr<ParamSnapshot> theta,
                                               std::vector<at::Tensor> momentum) {
  const std::vector<at::Tensor> tensors = TensorsOf(theta->params);
  std::unique_ptr<ThetaStore> store;
  if (config.outer.mode == OuterMode::kAsync) {
    store = std::make_unique<AsyncThetaStore>(config, std::move(theta), momentum);
  } else {
    store = std::make_unique<SyncThetaStore>(config, std::move(theta));
  }
  store->outer_step_->set_momentum_buffers(std::move(momentum));
  store->outer_step_->Reserve(tensors);  // the first round's step allocates nothing
  return store;
}

std::shared_ptr<const ParamSnapshot> ThetaStore::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

int64_t ThetaStore::round() const {
  absl::MutexLock lock(&mu_);
  return current_->round;
}

}  // namespace diloco
