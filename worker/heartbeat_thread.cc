#include "worker/heartbeat_thread.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace diloco {

HeartbeatThread::HeartbeatThread(CoordinatorClient& client, RunFlags& flags, std::chrono::milliseconds interval)
    : client_(client),
      flags_(flags),
      interval_(std::max(std::chrono::milliseconds(100), interval)),
      thread_([this] { Loop(); }) {}

void HeartbeatThread::Stop() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
}

void HeartbeatThread::Loop() {
  const std::atomic<bool>& stop = flags_.stop;
  while (!done_ && !stop) {
    for (auto waited = std::chrono::milliseconds(0); waited < interval_ && !done_ && !stop;
         waited += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (done_ || stop) break;
    auto beat = client_.Heartbeat(flags_.round);  // failures are handled by the exchange's own calls
    if (beat.ok() && beat->drain() && !flags_.drain) {
      spdlog::info("the coordinator asks this worker to leave (diloco-ctl leave); abandoning the round");
      flags_.drain = true;
      flags_.quit = true;
    }
    // The run's last round closed while this worker trains a round: its push could not count, so the training is
    // abandoned and the worker leaves (before, it trained on and pushed to a coordinator that may have exited). Not
    // otherwise: after its push the pull says the run is complete, and the worker saves its state first.
    if (beat.ok() && beat->run_complete() && flags_.training && !completed_) {
      spdlog::info("the run completed (round {}) while this worker trained round {}; abandoning the round",
                   beat->round(), flags_.round + 1);
      completed_ = true;
      flags_.quit = true;
    }
  }
}

}  // namespace diloco
