// SerialExecutor: one thread of its own that runs posted tasks one at a time, in the order posted, and is joined
// (never detached), so a task cannot outlive what it uses: its owner stops it before destroying those. The service
// runs the operator's Checkpoint RPC on one (service.h), off gRPC's threads, since a checkpoint blocks on the disk
// for seconds.
//
// Stop() lets the running task finish, calls every task still waiting with run = false on the calling thread (so it
// can answer its caller "shutting down"), and joins the thread; a Post after Stop calls the task with run = false at
// once, on the posting thread. The destructor stops it.
// Ownership: owns its thread and the waiting tasks. Thread-safety: Post and Stop may be called from any thread (Stop
// from one at a time, never from a task); tasks run with no lock of the executor held.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace diloco {

class SerialExecutor {
 public:
  // run: true on the executor's thread; false when the executor stopped before the task could start.
  using Task = std::function<void(bool run)>;

  SerialExecutor();
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Post(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<Task> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the constructor, joined by Stop
};

}  // namespace diloco
