#include "coordinator/theta_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "coordinator/theta_spill.h"

namespace diloco {
namespace {

std::vector<at::Tensor> TensorsOf(const NamedTensors& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const auto& [name, p] : params) out.push_back(p);
  return out;
}

// A new theta's id: random, never 0 (theta_0's).
uint64_t NewThetaId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

// The next version's snapshot header: round + 1, a new id, complete once it reaches the run's last round.
std::shared_ptr<ParamSnapshot> NextOf(const ParamSnapshot& base, int64_t rounds_total) {
  auto next = std::make_shared<ParamSnapshot>();
  next->round = base.round + 1;
  next->id = NewThetaId();
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
    guard_->id = theta->id;
    theta->guard = guard_;
  }

  std::shared_ptr<ParamSnapshot> Step(const std::vector<at::Tensor>& delta, const std::vector<size_t>* only,
                                      const CandidateCheck& check) override {
    const std::shared_ptr<const ParamSnapshot> base = current();
    std::shared_ptr<ParamSnapshot> next = NextOf(*base, rounds_total_);
    next->guard = guard_;
    next->params = base->params;  // the same tensors, which now hold theta_{t+1}
    const std::vector<at::Tensor> theta = TensorsOf(base->params);
    std::unique_ptr<ThetaSpill> spill;
    if (check) {
      absl::StatusOr<std::unique_ptr<ThetaSpill>> spilled = Spill(theta, only);
      if (spilled.ok()) {
        spill = *std::move(spilled);
      } else {  // a full or read-only checkpoint_dir: refusing the round would refuse its redo the same way, forever
        spdlog::warn(
            "round {}: {}; stepping without the evaluation's guard (a non-finite evaluation of this round "
            "cannot send it back)",
            next->round, std::string(spilled.status().message()));
      }
    }
    OuterStepState before = spill ? outer_step_->SaveState() : OuterStepState{};
    {
      absl::MutexLock stepping(&guard_->mu);  // pulls and checkpoints of theta_t wait, then find it moved on
      outer_step_->StepInPlace(theta, delta, only);
      ++guard_->writes;
      // Without a check the tensors and their round change in one critical section: a steady read (a checkpoint)
      // between two would save theta_{t+1} as round t.
      if (spill) {
        guard_->vetting = true;
      } else {
        next = Settle(std::move(next));
      }
    }
    if (!spill) {
      if (check) CheckCommitted(check, *next);
      return next;
    }
    try {
      check(*next);  // readers of theta_t find it moved on meanwhile; a steady read waits
    } catch (...) {
      Undo(*base, *spill, std::move(before));
      throw;
    }
    absl::MutexLock done(&guard_->mu);
    guard_->vetting = false;
    return Settle(std::move(next));
  }

  void Publish(std::shared_ptr<const ParamSnapshot> next) override {
    absl::MutexLock lock(&mu_);
    current_ = std::move(next);
  }

  // No step runs while the guard is held shared, and the round is the one the tensors hold (a step may have
  // finished before its snapshot was published).
  absl::Status ReadSteady(const std::function<absl::Status(const SteadyTheta&)>& read) override {
    absl::ReaderMutexLock steady(&guard_->mu);
    guard_->mu.Await(absl::Condition(&NotVetting, guard_.get()));  // not the candidate of a checked step
    const std::shared_ptr<const ParamSnapshot> theta = current();
    return read({guard_->round, guard_->id, theta->params, outer_step_->momentum_buffers()});
  }

 private:
  static bool NotVetting(ThetaGuard* guard) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !guard->vetting; }

  // The guard says the tensors hold `next`'s round.
  std::shared_ptr<ParamSnapshot> Settle(std::shared_ptr<ParamSnapshot> next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(guard_->mu) {
    guard_->round = next->round;
    guard_->id = next->id;
    next->writes = guard_->writes;
    return next;
  }

  // The check of a step that could not be spilled, after it is committed: nothing can undo it, so a refusal (or an
  // evaluation that throws) is logged, not thrown (a throw would send a stepped round back to be stepped again).
  static void CheckCommitted(const CandidateCheck& check, const ParamSnapshot& committed) {
    try {
      check(committed);
    } catch (const std::exception& e) {
      spdlog::error("round {}: {}; the round stays committed (its step could not be set aside to undo)",
                    committed.round, e.what());
    }
  }

  // The stepped tensors' theta and momentum (none before the first step: the optimizer state's handles undo that),
  // spilled before a checked step. An error when the file cannot be written (a full or read-only checkpoint_dir):
  // the step then goes on without the guard.
  absl::StatusOr<std::unique_ptr<ThetaSpill>> Spill(const std::vector<at::Tensor>& theta,
                                                    const std::vector<size_t>* only) const {
    const std::vector<at::Tensor>& momentum = outer_step_->momentum_buffers();
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < theta.size(); ++i) {
      if (only != nullptr && std::find(only->begin(), only->end(), i) == only->end()) continue;
      tensors.push_back(theta[i]);
      if (i < momentum.size()) tensors.push_back(momentum[i]);
    }
    return ThetaSpill::Write(spill_dir_, std::move(tensors));
  }

  // A checked step was refused: theta_t and the momentum back from the spill, the optimizer state's handles, and
  // theta_t published again under a new writes count (readers of the old snapshot start over).
  void Undo(const ParamSnapshot& base, ThetaSpill& spill, OuterStepState before) {
    absl::MutexLock undoing(&guard_->mu);
    const absl::Status restored = spill.Restore();
    if (!restored.ok()) {  // theta holds neither round: nothing may read it again
      spdlog::critical("cannot undo the refused step ({}); the coordinator stops", std::string(restored.message()));
      std::abort();
    }
    outer_step_->RestoreState(std::move(before));
    ++guard_->writes;
    guard_->vetting = false;
    auto again = std::make_shared<ParamSnapshot>(base);
    again->writes = guard_->writes;
    Publish(std::move(again));
  }

  const std::shared_ptr<ThetaGuard> guard_;  // the round the tensors hold; shared with every snapshot
};

// Asynchronous rounds: versioned immutable snapshots (theta_store.h).
class AsyncThetaStore : public ThetaStore {
 public:
  AsyncThetaStore(const Config& config, std::shared_ptr<ParamSnapshot> theta, std::vector<at::Tensor> momentum)
      : ThetaStore(config, std::move(theta)), momentum_(std::move(momentum)) {}

  std::shared_ptr<ParamSnapshot> Step(const std::vector<at::Tensor>& delta, const std::vector<size_t>* only,
                                      const CandidateCheck& check) override {
    std::shared_ptr<const ParamSnapshot> base;
    std::vector<at::Tensor> recycle;
    {
      absl::MutexLock lock(&mu_);
      base = current_;
      if (previous_ && previous_.use_count() == 1) recycle = TensorsOf(previous_->params);  // no pull reads it
      previous_.reset();
    }
    std::shared_ptr<ParamSnapshot> next = NextOf(*base, rounds_total_);
    OuterStepState before = check ? outer_step_->SaveState() : OuterStepState{};
    std::vector<at::Tensor> stepped = outer_step_->Step(TensorsOf(base->params), delta, std::move(recycle), only);
    for (size_t i = 0; i < stepped.size(); ++i) next->params.emplace_back(base->params[i].first, stepped[i]);
    if (check) {
      try {
        check(*next);  // theta_t is untouched and stays published; nobody else holds next
      } catch (...) {
        outer_step_->RestoreState(std::move(before));
        throw;
      }
    }
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
    return read({theta->round, theta->id, theta->params, momentum});
  }

 private:
  // theta_{t-1}, whose memory the next step reuses when no pull holds it.
  std::shared_ptr<const ParamSnapshot> previous_ ABSL_GUARDED_BY(mu_);
  // The outer momentum after the step that produced current_.
  std::vector<at::Tensor> momentum_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

ThetaStore::ThetaStore(const Config& config, std::shared_ptr<const ParamSnapshot> theta)
    : rounds_total_(config.SyncRounds()),
      spill_dir_(config.CheckpointDir()),
      outer_step_(MakeOuterStep(config)),
      current_(std::move(theta)) {}

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
