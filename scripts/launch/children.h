// Children: the processes diloco-launch starts (the coordinator, the workers or the ranks of --mode ddp) and how it
// starts, watches, stops and reaps them. Each child's stdout and stderr go through one pipe to a pump thread that
// copies every line to stdout behind "[name] " and keeps the last error line the child printed (ErrorMessageOf), which
// the supervision decision reports. Say() prints the launcher's own "[launch] " lines between them. Thread-safety:
// Children is used by one thread (the launcher's main thread); the pumps share only ChildLog (its own mutex) and the
// print lock.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "config/subprocess.h"
#include "scripts/launch/supervision.h"

namespace diloco::launch {

// Prints "[launch] LINE" (under the lock the pumps print with).
void Say(const std::string& line);

// What a pump thread keeps of its child's output.
class ChildLog {
 public:
  void Record(const std::string& line);  // keeps it if it is an error line
  std::string last_error() const;

 private:
  mutable absl::Mutex mu_;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

struct Child {
  std::string name;
  Subprocess process;
  std::thread pump;
  std::shared_ptr<ChildLog> log;
  double exited_at = -1;       // seconds since the launcher's start once seen exited, else < 0
  int exit_code = 0;           // once exited
  bool stopped_by_us = false;  // it was still running when StopAll signalled it
};

class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children();  // stops and reaps what is left

  // Starts argv with its output pumped behind "[name] "; ABORTED if it cannot start.
  absl::Status Start(const std::string& name, const std::vector<std::string>& argv);
  size_t size() const { return children_.size(); }
  Child& operator[](size_t i) { return children_[i]; }

  // Polls every child (recording when each exits) and describes child i for the supervision decision.
  void Poll(double now);
  ChildView View(size_t i) const;
  bool AnyRunning();

  // SIGTERM to every child still running (the last started first: workers leave before the coordinator stops), then
  // SIGKILL to any that has not exited after 10 s.
  void StopAll();
  // Waits for every child, joins its pump, reports each non-zero exit but those StopAll's SIGTERM caused; returns 0 if
  // every child exited 0, else 1.
  int Reap();

 private:
  std::vector<Child> children_;
  bool reaped_ = false;
};

// Seconds on the launcher's monotonic clock (since its start).
double Now();

}  // namespace diloco::launch
