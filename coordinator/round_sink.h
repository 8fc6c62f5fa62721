// RoundSink: what happens after a round's outer step, behind one interface the round thread calls, so the round loop
// (coordinator_round_loop.cc) only closes, steps and publishes. The sinks the core runs (round_sinks.h): the replay
// log, the round's log line, the evaluation, the checkpoint writer and summary.json; RoundSinks calls them in the
// order they were added, each hook in turn:
//   OnStart      once, before the first round, with the run's starting theta (theta_0 or a checkpoint's theta_t);
//                an error is a start-up error (CoordinatorCore::Create fails with it);
//   OnStepped    the step succeeded and theta_t is not yet published: the only hook that sees the averaged
//                pseudo-gradient (`delta`), which goes back to the accumulator, zeroed, right after;
//   OnCommitted  theta_t is published (pulls get it, pushes for the next round fold while the sinks run);
//   OnRunComplete the last round committed and the core says complete (status, heartbeats).
// A sink logs its own failures; training goes on. A sink that throws in OnStepped ends the round loop's pass like a
// failed step (the round is published, its next pulls are full); one that throws in OnCommitted or OnRunComplete
// (the round is committed: nothing is redone) is logged, and the sinks after it still run, so that a failed log line
// or evaluation record never keeps the last round's checkpoint, summary.json or the run's completion from happening.
// Thread-safety: the hooks run on the core's round thread (OnStart on the thread that creates the core, before the
// round thread starts), one at a time, with no core lock held; a sink that other threads also use (the checkpoint
// writer) guards itself.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/theta_store.h"

namespace diloco {

// A round as the sinks see it. On the round thread nothing writes `theta` (the next step runs after the sinks).
struct ClosedRound {
  std::shared_ptr<const ParamSnapshot> theta;      // theta_t (OnStart: the starting theta)
  const std::vector<at::Tensor>* delta = nullptr;  // OnStepped only: the averaged pseudo-gradient, in spec order
  std::string reason;                              // why the round closed
  size_t pushes = 0;                               // pushes averaged into it
  double tokens = 0;                               // their tokens, as claimed (not the fold weights)
  double step_seconds = 0;                         // the outer step's time
  double round_seconds = 0;                        // open to published (from OnCommitted on)
  int64_t tokens_committed = 0;                    // run totals with this round booked (from OnCommitted on)
  int64_t bytes_pushed_committed = 0;
};

class RoundSink {
 public:
  virtual ~RoundSink() = default;
  virtual absl::Status OnStart(const ClosedRound& start) {
    (void)start;
    return absl::OkStatus();
  }
  virtual void OnStepped(const ClosedRound& round) { (void)round; }
  virtual void OnCommitted(const ClosedRound& round) { (void)round; }
  virtual void OnRunComplete() {}
};

// The sinks of a core, called in the order added. Owns them. Same thread rules as RoundSink.
class RoundSinks : public RoundSink {
 public:
  // Returns the sink, still owned here (for a caller that also uses it directly, e.g. the checkpoint writer).
  template <typename Sink>
  Sink* Add(std::unique_ptr<Sink> sink) {
    Sink* raw = sink.get();
    sinks_.push_back(std::move(sink));
    return raw;
  }

  absl::Status OnStart(const ClosedRound& start) override {
    for (const auto& sink : sinks_) {
      if (absl::Status s = sink->OnStart(start); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  void OnStepped(const ClosedRound& round) override {
    for (const auto& sink : sinks_) sink->OnStepped(round);
  }
  // These two catch what a sink throws (logged; round_sinks.cc) and go on to the next sink.
  void OnCommitted(const ClosedRound& round) override;
  void OnRunComplete() override;

 private:
  std::vector<std::unique_ptr<RoundSink>> sinks_;
};

}  // namespace diloco
