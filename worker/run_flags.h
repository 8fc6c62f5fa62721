// RunFlags: the flags a worker's threads share to say that the run must end, and the round being trained. Every
// field is atomic; the comment on each names the threads that set it (the rest only read it):
//   main       the thread that runs Worker::Run (set-up, the rounds, the inner loop)
//   exchange   the thread of the push and pull (the main thread itself without comm.overlap_steps)
//   heartbeat  the HeartbeatThread (worker/heartbeat_thread.h)
//   signal     the process's signal handler (diloco-worker's main)
#pragma once

#include <atomic>
#include <cstdint>

namespace diloco {

struct RunFlags {
  explicit RunFlags(const std::atomic<bool>& signal) : stop(signal) {}

  const std::atomic<bool>& stop;      // set by: signal (SIGINT/SIGTERM)
  std::atomic<bool> drain{false};     // set by: heartbeat, exchange (the coordinator asks this worker to leave)
  std::atomic<bool> quit{false};      // set by: heartbeat, exchange (drain, run complete); the inner loop abandons its
                                      // round (on quit or stop)
  std::atomic<bool> training{false};  // set by: main (it trains a round's steps, not comm.overlap_steps' next ones)
  std::atomic<bool> failed{false};    // set by: main (a collective of the cluster failed: the exchange gives up too)
  std::atomic<int64_t> round{0};      // set by: main (the round being trained; heartbeats name it)

  // True once a signal or an operator's drain asks this worker to go, or its cluster failed.
  bool Stopping() const { return stop || drain || failed; }
};

}  // namespace diloco
