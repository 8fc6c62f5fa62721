// CheckpointDirLock: one coordinator per checkpoint directory. Two coordinators started on one run.output_dir (the
// examples listen on port 0, so no port clash stops the second) would each write ckpt-*.bin and summary.json over the
// other's. The lock is flock(2) on DIR/.coordinator.lock, which holds the owner's pid; the kernel releases it when the
// process exits, kill -9 included, so a stale file never blocks a restart. Held from start-up until the process exits.
// Not thread-safe: the coordinator's main takes it once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace diloco {

class CheckpointDirLock {
 public:
  // Locks `dir` (created if missing). FailedPrecondition naming the directory and the other coordinator's pid when
  // another process holds it; a lock file that cannot be made (a read-only directory) is a warning and no lock.
  static absl::StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(const std::string& dir);
  ~CheckpointDirLock();  // releases the lock (closes the file)
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  explicit CheckpointDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace diloco
