// LocalState: what a worker keeps of its own between rounds besides its model, and on its own disk so that a restart
// with the same --id resumes where it stopped (worker/worker_state.h has the files): the inner AdamW's moments and
// step count and the data sampler's position (both live in the InnerTrainer; this class saves and restores them),
// the per-step position journal and the window trace (data.trace_windows), and each fragment's error feedback
// (comm.error_feedback, or codec topk's accumulator: what compression dropped from the last push,
// worker/error_feedback.h), saved with the state and restored on resume.
// Owns the state directory's files, the trace file and the error feedback; the trainer is the worker's.
// Worker clusters keep no state on disk yet (every restart starts cold); they do keep error feedback.
// Thread-safety: not thread-safe; the worker's main thread only (the window observer it installs runs inside the
// trainer's inner steps, on that thread).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/data_cache.h"
#include "proto/named_tensors.h"
#include "worker/error_feedback.h"
#include "worker/trainer.h"
#include "worker/worker_state.h"

namespace diloco {

class LocalState {
 public:
  // Resumes `trainer` from a saved state of this run (workers.resume; `identity` says whose state fits) and installs
  // the position journal and the window trace. `on_disk` false (a worker cluster): no files.
  LocalState(const Config& config, InnerTrainer& trainer, StateIdentity identity, bool on_disk, int fragments);

  // After each push of `round` (1-based): the optimizer state, the data position and the round, atomically.
  void Save(int64_t round);
  // Once, before the first inner step after a resume: logs where the optimizer resumed.
  void BeforeFirstStep();
  // comm.error_feedback: adds fragment f's residual to its pseudo-gradient and keeps the new residual.
  // False (nothing done) without error feedback; sent: as ErrorFeedback::Compensate's.
  bool Compensate(int fragment, NamedTensors& pseudo_gradient, ErrorFeedback::Sent* sent = nullptr);

 private:
  void Resume();
  void RestoreErrorFeedback(const std::vector<torch::Tensor>& saved);
  void OnWindow(const WindowDraw& draw);  // the trainer's window observer

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  const Config& config_;
  InnerTrainer& trainer_;
  const StateIdentity identity_;
  std::string state_dir_;  // "" = none kept
  bool resumed_ = false;   // until BeforeFirstStep has logged
  bool position_warned_ = false;
  std::unique_ptr<std::FILE, FileCloser> windows_trace_;        // data.trace_windows
  std::vector<WindowDraw> pending_draws_;                       // this batch's windows, until its position is saved
  std::vector<std::unique_ptr<ErrorFeedback>> error_feedback_;  // per fragment; null without comm.error_feedback
};

}  // namespace diloco
