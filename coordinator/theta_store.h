// ThetaStore: where the coordinator keeps theta_t, the global parameters, and how the outer step moves them on.
// It owns the published snapshot (ParamSnapshot, shared by every pull of it), the outer step (outer_step.h) and its
// momentum, and whatever the mode needs to let readers on other threads (pulls, an operator's checkpoint) share theta
// with the step. Two implementations, chosen once from outer.mode by ThetaStore::Create; nothing outside this file
// and round_policy.h asks which one runs:
//   synchronous (outer.mode sync): one copy of theta, stepped in place (OuterStep::StepInPlace) under a ThetaGuard;
//     pulls read it under the guard's shared lock, and a pull that outlives its round finds the guard moved on and
//     ends UNAVAILABLE (the worker pulls again). The momentum is updated in place too, so a checkpoint writes both
//     under the guard (no step runs meanwhile).
//   asynchronous (outer.mode async): versioned immutable snapshots; Step writes theta_{t+1} into new tensors
//     (OuterStep::Step), theta_{t-1} is kept for pulls of older versions (its memory is reused for theta_{t+1} once
//     no pull holds it), and the momentum is snapshotted with every published version for checkpoints.
// Memory: coordinator.h "Memory" (sync: theta and the momentum, one copy each; async: one copy of theta more).
// A step checked by the evaluation (Step's `check`) keeps theta_t exactly without a copy in memory: synchronous rounds
// spill the stepped tensors' theta and momentum to an unlinked file first (8 bytes a parameter of disk, written
// once per evaluated round, read back only when the evaluation refuses the step); asynchronous rounds keep theta_t
// anyway and the optimizer state's handles.
// Thread-safety: current() / round() / ReadSteady() from any thread (the published state sits under the store's own
// mutex, a leaf lock: nothing is called while it is held; ReadSteady's guard is taken before it). Step() and
// Publish() belong to the round thread (one at a time). The owner publishes under its own lock, so the round it reads
// under that lock stays put (CoordinatorCore::mu_).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "coordinator/outer_step.h"
#include "proto/named_tensors.h"

namespace diloco {

// Synchronous rounds step theta in place (one copy of theta, coordinator.h "Memory"): the tensors
// published for round t are overwritten with theta_{t+1} when round t+1 closes. The guard says which round the
// tensors hold now: the round thread holds `mu` exclusively while it steps and then sets `round`; a reader on
// another thread (a pull in flight, an operator's checkpoint) holds it shared while it reads (ReadSnapshot).
// `writes` counts the step's writes of the tensors (a step, and the undo of a step the evaluation refused): a reader
// also checks it, because an undone step leaves `round` as it was while a pull's raw bytes may have been read in
// between. `vetting`: a stepped theta is being evaluated (ThetaStore::Step's check): readers find it moved on, and a
// steady read (checkpoints) waits.
struct ThetaGuard {
  absl::Mutex mu;
  int64_t round ABSL_GUARDED_BY(mu) = 0;
  uint64_t id ABSL_GUARDED_BY(mu) = 0;  // that round's ParamSnapshot::id
  int64_t writes ABSL_GUARDED_BY(mu) = 0;
  bool vetting ABSL_GUARDED_BY(mu) = false;
};

// theta_round as published to pulls (shared by every pull in flight). Without a guard (asynchronous rounds) it is
// immutable once published; with one (synchronous rounds) it is valid while guard->round == round.
struct ParamSnapshot {
  int64_t round = 0;
  // Which theta_round this is (PullHeader.theta_id): random per outer step, 0 for theta_0 (the same in every start),
  // a checkpoint's for the theta resumed from it. A coordinator resumed from an older checkpoint steps a round again
  // to another theta under the same number: the id tells the two apart.
  uint64_t id = 0;
  bool complete = false;
  NamedTensors params;                // theta_round, float32
  std::shared_ptr<ThetaGuard> guard;  // null: immutable
  int64_t writes = 0;                 // guard->writes when published
};

// Runs read() while `guard` (null: an immutable snapshot) says theta holds `round` as of `writes`, under the
// guard's shared lock; returns false without running it once theta has moved on (the reader must start over from
// the current snapshot). Blocks while the round thread steps theta (up to one outer step; not during an evaluation).
template <typename Read>
bool ReadIfAtRound(ThetaGuard* guard, int64_t round, int64_t writes, Read read) {
  if (guard == nullptr) {
    read();
    return true;
  }
  absl::ReaderMutexLock lock(&guard->mu);
  if (guard->round != round || guard->writes != writes) return false;
  read();
  return true;
}

// ReadIfAtRound for `snapshot`'s round.
template <typename Read>
bool ReadSnapshot(const ParamSnapshot& snapshot, Read read) {
  return ReadIfAtRound(snapshot.guard.get(), snapshot.round, snapshot.writes, read);
}

// theta_t and its momentum as ReadSteady shows them: nothing writes them while the reader runs.
struct SteadyTheta {
  int64_t round = 0;                        // the round the tensors hold
  uint64_t id = 0;                          // its ParamSnapshot::id
  const NamedTensors& params;               // theta_round
  const std::vector<at::Tensor>& momentum;  // the outer momentum after round `round`'s step (empty: none yet)
};

class ThetaStore {
 public:
  // The store of `config`'s outer.mode over `theta` (theta_0, or a checkpoint's theta_t) and its momentum (empty:
  // none yet), with config's outer step; allocates what the first step needs (OuterStep::Reserve).
  static std::unique_ptr<ThetaStore> Create(const Config& config, std::shared_ptr<ParamSnapshot> theta,
                                            std::vector<at::Tensor> momentum);
  virtual ~ThetaStore() = default;

  // The published theta_t. Thread-safe.
  std::shared_ptr<const ParamSnapshot> current() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t round() const ABSL_LOCKS_EXCLUDED(mu_);

  // A check of the stepped theta_{t+1} before anyone else may read it (the evaluation, issue 32 item 4); it throws
  // to refuse it.
  using CandidateCheck = std::function<void(const ParamSnapshot& candidate)>;
  // Round thread: theta_{t+1} = OuterOpt(theta_t, delta) (positions `only`, or all when null), not yet published.
  // Synchronous: written over theta_t (pulls of it then find it moved on); asynchronous: into new tensors. Throws
  // when the outer step refuses (theta and the momentum are then as they were).
  // With `check`: runs it on theta_{t+1} before returning; when it throws, theta_t and the momentum are put back
  // exactly (synchronous: from a spill file of the stepped tensors written before the step, theta_spill.h, in the
  // checkpoint directory; asynchronous: theta_t was never touched and the optimizer state's handles are restored),
  // theta_t is published again as a new snapshot (pulls that read it meanwhile start over) and the exception
  // propagates. No pull or checkpoint reads theta_{t+1} while the check runs (they see theta moved on, or wait).
  // Synchronous, when the spill file cannot be written (a full or read-only checkpoint directory): a warning, the
  // step commits, and the check runs after it with its refusal logged, not thrown (before, the round was refused and
  // its redo failed the same way, forever).
  virtual std::shared_ptr<ParamSnapshot> Step(const std::vector<at::Tensor>& delta, const std::vector<size_t>* only,
                                              const CandidateCheck& check = nullptr) ABSL_LOCKS_EXCLUDED(mu_) = 0;
  // Round thread: makes `next` (Step's result) the published theta.
  virtual void Publish(std::shared_ptr<const ParamSnapshot> next) ABSL_LOCKS_EXCLUDED(mu_) = 0;
  // Runs read() with theta_t and its momentum steady (synchronous: under the guard's shared lock, so the next step
  // waits for it; asynchronous: the published version, immutable) and returns its status. Thread-safe.
  virtual absl::Status ReadSteady(const std::function<absl::Status(const SteadyTheta&)>& read)
      ABSL_LOCKS_EXCLUDED(mu_) = 0;

 protected:
  ThetaStore(const Config& config, std::shared_ptr<const ParamSnapshot> theta);

  const int64_t rounds_total_;             // config.SyncRounds(): the round that completes the run
  const std::string spill_dir_;            // config.CheckpointDir(): where a checked step spills (synchronous)
  std::unique_ptr<OuterStep> outer_step_;  // the round thread's (and ReadSteady's, while no step can run)
  mutable absl::Mutex mu_;
  std::shared_ptr<const ParamSnapshot> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace diloco
