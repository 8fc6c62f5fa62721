// Backoff: exponential backoff with jitter for a worker's retries (Join, Push, Pull, Heartbeat). Each Sleep waits a
// random time in [base/2, base], then doubles base up to max_s; Reset puts base back to 0.2 s. The random source and
// the sleeper are injected (defaults: a std::mt19937_64 seeded from std::random_device, std::this_thread::sleep_for),
// so tests drive it with no real time. The wait is cut into ticks of at most 50 ms so a stop flag ends it early.
// Not thread-safe: one Backoff per thread (the worker's main loop and its exchange thread never retry at once: the
// main loop waits for the exchange before it calls again).
#pragma once

#include <atomic>
#include <functional>

namespace diloco {

class Backoff {
 public:
  using Uniform = std::function<double()>;              // a uniform random number in [0, 1]
  using Sleeper = std::function<void(double seconds)>;  // sleeps (at most 50 ms per call)
  static constexpr double kInitialSeconds = 0.2;
  static constexpr double kTickSeconds = 0.05;

  explicit Backoff(double max_s, Uniform uniform = {}, Sleeper sleeper = {});

  // Sleeps a random time in [base/2, base] (in ticks of kTickSeconds, checking `stop` before each), then doubles
  // base up to max_s. Returns the time it meant to sleep (what it did sleep is less if `stop` was set).
  double Sleep(const std::atomic<bool>& stop);
  void Reset() { base_ = kInitialSeconds; }
  double base() const { return base_; }  // the upper bound of the next Sleep

 private:
  double base_ = kInitialSeconds;
  double max_s_;
  Uniform uniform_;
  Sleeper sleeper_;
};

}  // namespace diloco
