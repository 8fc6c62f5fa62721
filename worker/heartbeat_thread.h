// HeartbeatThread: keeps a worker's lease alive while it trains. Every `interval` (at least 100 ms) it sends a
// Heartbeat naming flags.round; a reply asking this worker to leave (diloco-ctl leave) sets flags.drain and
// flags.quit, one saying that the run is complete while the worker trains (flags.training) sets flags.quit (once). A
// signal (flags.stop) ends the thread; the inner loop watches flags.stop itself (a heartbeat call that a coordinator
// does not answer may hold this thread for workers.rpc_timeout_s). A failed heartbeat is left to the exchange's own
// calls.
// Owns its thread: the constructor starts it, Stop (or the destructor) ends and joins it.
// Thread-safety: the thread touches only the client (thread-safe) and the flags (atomics); construct, Stop and
// destroy on one thread (the worker's main thread).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "worker/client.h"
#include "worker/run_flags.h"

namespace diloco {

class HeartbeatThread {
 public:
  HeartbeatThread(CoordinatorClient& client, RunFlags& flags, std::chrono::milliseconds interval);
  ~HeartbeatThread() { Stop(); }
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

  void Stop();

 private:
  void Loop();

  CoordinatorClient& client_;
  RunFlags& flags_;
  const std::chrono::milliseconds interval_;
  std::atomic<bool> done_{false};  // set by Stop
  bool completed_ = false;         // the thread's: it saw the run complete while the worker trained
  std::thread thread_;             // last: starts once the fields above are set
};

}  // namespace diloco
