// Evaluator: what the coordinator core knows of evaluation, a function theta -> validation loss (nats/token). The
// core holds one and calls it on the round thread after a round closes (coordinator.eval_every); the model host
// (model_host.h) builds the real one over the model and the validation token shard, tests pass a fake.
// Also NamedTensors and ParamSnapshot, the plain-tensor form of theta the core is built from and publishes, and the
// ThetaGuard that lets readers on other threads share theta with the in-place outer step (thread-safe).
// An Evaluator is called from one thread at a time (the core's round thread); it need not be thread-safe. It reads
// theta on that thread, where nothing writes it, and must not keep a reference to it after Evaluate returns.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/named_tensors.h"

namespace diloco {

// Synchronous rounds step theta in place (one copy of theta, coordinator.h "Memory"): the tensors
// published for round t are overwritten with theta_{t+1} when round t+1 closes. The guard says which round the
// tensors hold now: the round thread holds `mu` exclusively while it steps and then sets `round`; a reader on
// another thread (a pull in flight, an operator's checkpoint) holds it shared while it reads (ReadSnapshot).
struct ThetaGuard {
  absl::Mutex mu;
  int64_t round ABSL_GUARDED_BY(mu) = 0;
};

// theta_round as published to pulls (shared by every pull in flight). Without a guard (asynchronous rounds) it is
// immutable once published; with one (synchronous rounds) it is valid while guard->round == round.
struct ParamSnapshot {
  int64_t round = 0;
  bool complete = false;
  NamedTensors params;                // theta_round, float32
  std::shared_ptr<ThetaGuard> guard;  // null: immutable
};

// Runs read() while `guard` (null: an immutable snapshot) says theta holds `round`, under the guard's shared lock;
// returns false without running it once theta has moved on (the reader must start over from the current snapshot).
// Blocks while the round thread steps theta (up to one outer step).
template <typename Read>
bool ReadIfAtRound(ThetaGuard* guard, int64_t round, Read read) {
  if (guard == nullptr) {
    read();
    return true;
  }
  absl::ReaderMutexLock lock(&guard->mu);
  if (guard->round != round) return false;
  read();
  return true;
}

// ReadIfAtRound for `snapshot`'s round.
template <typename Read>
bool ReadSnapshot(const ParamSnapshot& snapshot, Read read) {
  return ReadIfAtRound(snapshot.guard.get(), snapshot.round, read);
}

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // The validation loss of `theta` (same names and shapes as theta_0). May throw: the core logs the failure and
  // training goes on without that evaluation.
  virtual double Evaluate(const NamedTensors& theta) = 0;
};

}  // namespace diloco
