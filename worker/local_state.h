// LocalState: what a worker keeps of its own between rounds besides its model, and on its own disk so that a restart
// with the same --id resumes where it stopped (worker/worker_state.h has the files): the inner AdamW's moments and
// step count and the data sampler's position (both live in the InnerTrainer; this class saves and restores them),
// the per-step position journal and the window trace (data.trace_windows), and each fragment's error feedback
// (comm.error_feedback, or codec topk's accumulator: what compression dropped from the last push,
// worker/error_feedback.h), saved with the state and restored on resume.
// Owns the state directory's files, the trace file and the error feedback; the trainer is the worker's.
// Each rank of a worker cluster has its own LocalState and files (worker/worker_state.h: StateKey): its moments (its
// slice's with workers.sharding), step, data position and residual. At set-up the ranks agree on the round they
// resume their optimizer state from (AgreeOnResumeRound: the newest save, round and AdamW step, every rank has;
// none: all start their moments fresh), so that no rank resumes moments of a round the others do not have; each rank's
// data position comes from its own journal either way (each rank reads its own part of the data). Thread-safety: not
// thread-safe; the worker's main thread only (the window observer it installs runs inside the trainer's inner steps, on
// that thread).
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/data_cache.h"
#include "proto/named_tensors.h"
#include "worker/error_feedback.h"
#include "worker/trainer.h"
#include "worker/worker_state.h"

namespace diloco {

// Whose state a trainer may resume (StateIdentity) for worker `worker_id`'s rank `cluster_rank` of `cluster_size`,
// reading part `shard_index` of `shard_count` of `cache`: the model's fingerprint and slice layout from `trainer`.
StateIdentity IdentityOf(const Config& config, const TokenCache& cache, const std::string& worker_id,
                         InnerTrainer& trainer, int64_t shard_index, int64_t shard_count, int64_t cluster_rank,
                         int64_t cluster_size);

// The shard this worker read before a restart, from its position journal (a cluster's: rank 0's), so that its first
// Join asks for it back instead of the lowest free one (which a restarted run's workers reach in any order: each would
// then find its saved state on another shard and start it over). -1 when there is none that fits: workers.resume
// off, no journal, or one of another model (`fingerprint`), seed or worker id.
int SavedShardHint(const Config& config, const std::string& worker_id, int64_t cluster_size,
                   const std::string& fingerprint);

// The slice layout a state records for `optimizer` (SliceLayout of its sharding and SlicePlan).
std::string SliceLayoutOf(const FlatAdamW& optimizer);

// A cluster's exchange of one line per rank: publishes this rank's `mine` under `topic` and returns every rank's, in
// rank order (WorkerCluster::ShareWithRanks); throws when a rank does not answer.
using ShareWithRanks = std::function<std::vector<std::string>(const std::string& topic, const std::string& mine)>;

class LocalState {
 public:
  // Resumes `trainer` from a saved state of this run (workers.resume; `identity` says whose state fits) and installs
  // the position journal and the window trace. A cluster's rank (identity.cluster_size > 1) passes `share`, through
  // which the ranks agree on the round they resume (every rank constructs its LocalState at set-up, or it waits).
  LocalState(const Config& config, InnerTrainer& trainer, StateIdentity identity, int fragments,
             ShareWithRanks share = nullptr);

  // After each push of `round` (1-based): the optimizer state, the data position and the round, atomically.
  void Save(int64_t round);
  // Once, before the first inner step after a resume: logs where the optimizer resumed.
  void BeforeFirstStep();
  // comm.error_feedback: adds fragment f's residual to its pseudo-gradient and keeps the new residual.
  // False (nothing done) without error feedback; sent: as ErrorFeedback::Compensate's.
  bool Compensate(int fragment, NamedTensors& pseudo_gradient, ErrorFeedback::Sent* sent = nullptr);
  // After that push: its residual stands if the push was counted, else the one before it comes back
  // (ErrorFeedback::Settle).
  void SettleFeedback(int fragment, bool counted);
  // comm.cluster_parts: this rank's slice of the residual lives in its PartExchange (worker/part_exchange.h);
  // `current` reads it at each Save (undefined: none yet). Returns the resumed state's slice residual (undefined
  // when none was resumed), for the exchange to start from.
  torch::Tensor KeepSliceResidual(std::function<torch::Tensor()> current);

 private:
  void Resume();
  // The saved states (a cluster rank's: the state and the previous one) that fit this run, newest first; each that
  // does not fit is named in a warning.
  std::vector<WorkerState> UsableStates() const;
  // The save to resume: the newest usable one, or for a cluster the one the ranks agree on (AgreeOnResumeRound).
  std::optional<SaveMark> ChooseSave(const std::vector<WorkerState>& usable) const;
  void RestoreErrorFeedback(const std::vector<torch::Tensor>& saved);
  void OnWindow(const WindowDraw& draw);  // the trainer's window observer

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  const Config& config_;
  InnerTrainer& trainer_;
  const StateIdentity identity_;
  const std::string key_;  // the files' StateKey
  const ShareWithRanks share_;
  std::string state_dir_;  // "" = none kept
  bool resumed_ = false;   // until BeforeFirstStep has logged
  bool position_warned_ = false;
  std::unique_ptr<std::FILE, FileCloser> windows_trace_;        // data.trace_windows
  std::vector<WindowDraw> pending_draws_;                       // this batch's windows, until its position is saved
  std::vector<std::unique_ptr<ErrorFeedback>> error_feedback_;  // per fragment; null without comm.error_feedback
  std::function<torch::Tensor()> slice_residual_;               // comm.cluster_parts (KeepSliceResidual)
  torch::Tensor resumed_slice_residual_;                        // the resumed state's, until KeepSliceResidual
};

}  // namespace diloco
