#include "worker/backoff.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

namespace diloco {

Backoff::Backoff(double max_s, Uniform uniform, Sleeper sleeper)
    : max_s_(max_s), uniform_(std::move(uniform)), sleeper_(std::move(sleeper)) {
  if (!uniform_) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    uniform_ = [rng] { return std::uniform_real_distribution<double>(0.0, 1.0)(*rng); };
  }
  if (!sleeper_) {
    sleeper_ = [](double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); };
  }
}

double Backoff::Sleep(const std::atomic<bool>& stop) {
  const double u = std::clamp(uniform_(), 0.0, 1.0);
  const double t = base_ * (0.5 + 0.5 * u);
  base_ = std::min(max_s_, base_ * 2);
  for (double left = t; left > 1e-9 && !stop;) {  // the epsilon: no tick for a rounding error's remainder
    const double tick = std::min(kTickSeconds, left);
    sleeper_(tick);
    left -= tick;
  }
  return t;
}

}  // namespace diloco
