// The round sinks of a coordinator run (round_sink.h), in the order CoordinatorCore adds them:
//   ReplayLogSink     coordinator.replay_log_dir (replay_log.h): theta_0 at start, each round's averaged
//                     pseudo-gradient once stepped (from the accumulator's tensor, before it is zeroed: no copy);
//   RoundLogSink      the "round t/T closed" log line;
//   EvaluationSink    the Evaluator (evaluator.h) on theta_0 (when the history is empty) and every
//                     coordinator.eval_every rounds and the last, recorded into the EvalHistory;
//   CheckpointWriter  theta_t + momentum + evals every coordinator.checkpoint_every rounds and the last, and on an
//                     operator's request (Write, from any thread);
//   SummarySink       <run.output_dir>/summary.json once the run is complete.
// EvalHistory: the run's evaluations (status, checkpoints), shared by the core, the evaluation sink and the writer.
// Thread-safety: EvalHistory and CheckpointWriter::Write are thread-safe (each under its own mutex, leaf locks apart
// from Write's, which is held while it reads theta through ThetaStore::ReadSteady); the hooks follow round_sink.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "coordinator/evaluator.h"
#include "coordinator/round_sink.h"
#include "coordinator/theta_store.h"
#include "proto/checkpoint.h"

namespace diloco {

class EvalHistory {
 public:
  explicit EvalHistory(std::vector<EvalRecord> records) : records_(std::move(records)) {}
  void Add(const EvalRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<EvalRecord> Records() const ABSL_LOCKS_EXCLUDED(mu_);
  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::vector<EvalRecord> records_ ABSL_GUARDED_BY(mu_);
};

class ReplayLogSink : public RoundSink {
 public:
  // `names`: the parameter names, in spec order (the order of the deltas).
  ReplayLogSink(std::string dir, std::string fingerprint, std::vector<std::string> names)
      : dir_(std::move(dir)), fingerprint_(std::move(fingerprint)), names_(std::move(names)) {}
  absl::Status OnStart(const ClosedRound& start) override;  // theta_0 (not when resuming)
  void OnStepped(const ClosedRound& round) override;

 private:
  const std::string dir_;
  const std::string fingerprint_;
  const std::vector<std::string> names_;
};

class RoundLogSink : public RoundSink {
 public:
  explicit RoundLogSink(int64_t rounds_total) : rounds_total_(rounds_total) {}
  void OnCommitted(const ClosedRound& round) override;

 private:
  const int64_t rounds_total_;
};

// The evaluation of a round runs before the round is published (issue 32 item 4): the core asks DueAt, and when due
// hands Vet to the theta store as the stepped theta's check (ThetaStore::Step), so that a non-finite validation loss
// refuses the step (theta and the momentum are put back, the round is discarded and redone) and no pull, checkpoint
// or status ever shows that theta; only when the store could not spill the step (a full checkpoint_dir) does it stay
// committed, the loss logged. OnCommitted then records and logs the vetted loss of the round it committed.
class EvaluationSink : public RoundSink {
 public:
  // every: coordinator.eval_every (> 0).
  EvaluationSink(int64_t every, std::unique_ptr<Evaluator> evaluator, std::shared_ptr<EvalHistory> history)
      : every_(every), evaluator_(std::move(evaluator)), history_(std::move(history)) {}
  absl::Status OnStart(const ClosedRound& start) override;  // theta_0's evaluation, when the history is empty
  // Whether round `round`'s theta is evaluated (every `every` rounds, and the last: `complete`).
  bool DueAt(int64_t round, bool complete) const { return complete || round % every_ == 0; }
  // Evaluates the stepped theta `candidate`: throws NonFiniteStep (outer_step.h) when its loss is NaN or Inf; an
  // evaluator that fails is logged and training goes on without that evaluation. Returns the seconds it took.
  double Vet(const ParamSnapshot& candidate);
  void OnCommitted(const ClosedRound& round) override;  // records Vet's loss for this round

 private:
  struct Vetted {
    int64_t round = 0;
    double loss = 0;
    double seconds = 0;
  };

  const int64_t every_;
  const std::unique_ptr<Evaluator> evaluator_;  // the round thread's
  const std::shared_ptr<EvalHistory> history_;
  std::optional<Vetted> vetted_;  // the last Vet's finite loss, until OnCommitted
};

struct WrittenCheckpoint {
  std::string path;
  int64_t round = 0;
};

class CheckpointWriter : public RoundSink {
 public:
  // Fills in what a checkpoint of `round` records of the run besides theta: its members (active and lost) and the
  // ids of the earlier thetas pushes may be computed against (thread-safe; called while theta is read).
  using RecordsAt = std::function<void(int64_t round, CheckpointData& data)>;
  // Reads theta through `theta` (not owned; outlives the writer); `members_config`: the ConfigHash they joined under.
  CheckpointWriter(const Config& config, std::string fingerprint, ThetaStore* theta,
                   std::shared_ptr<EvalHistory> history, RecordsAt records = nullptr, std::string members_config = "");
  // Writes the published theta_t, its momentum and the evals now (blocking file I/O; one write at a time). In
  // synchronous rounds the next outer step waits for it (ThetaStore::ReadSteady).
  absl::StatusOr<WrittenCheckpoint> Write() ABSL_LOCKS_EXCLUDED(mu_);
  // When due; a failure is logged and training goes on, but the last round's is tried 3 times (2 s apart) and, if
  // they all fail, kept in final_error().
  void OnCommitted(const ClosedRound& round) override;
  // Why the last round's checkpoint could not be written; "" when it was (or the run is not complete).
  std::string final_error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string dir_;
  const int64_t every_;  // coordinator.checkpoint_every (<= 0: only the last round and on request)
  const int64_t keep_;   // coordinator.keep_checkpoints
  const std::string fingerprint_;
  ThetaStore* const theta_;
  const std::shared_ptr<EvalHistory> history_;
  const RecordsAt records_;
  const std::string members_config_;
  mutable absl::Mutex mu_;  // one write at a time (the round thread and operator requests)
  std::string final_error_ ABSL_GUARDED_BY(mu_);
};

class SummarySink : public RoundSink {
 public:
  explicit SummarySink(std::function<void()> write_summary) : write_summary_(std::move(write_summary)) {}
  void OnRunComplete() override { write_summary_(); }

 private:
  const std::function<void()> write_summary_;
};

}  // namespace diloco
