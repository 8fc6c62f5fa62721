#include "coordinator/round_sinks.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/outer_step.h"
#include "coordinator/replay_log.h"

namespace diloco {

void RoundSinks::OnCommitted(const ClosedRound& round) {
  for (const auto& sink : sinks_) {
    try {
      sink->OnCommitted(round);
    } catch (const std::exception& e) {
      spdlog::error("round {}: {} (the round is committed; training goes on)", round.theta->round, e.what());
    }
  }
}

void RoundSinks::OnRunComplete() {
  for (const auto& sink : sinks_) {
    try {
      sink->OnRunComplete();
    } catch (const std::exception& e) {
      spdlog::error("at the run's end: {}", e.what());
    }
  }
}

namespace {

// Writes `data` (atomically, proto/checkpoint.h), prunes to `keep` files and logs the size and speed.
absl::StatusOr<WrittenCheckpoint> SaveAndLog(const std::string& dir, int64_t keep, const CheckpointData& data) {
  const std::string path = CheckpointPath(dir, data.round);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = SaveCheckpoint(path, data);
  if (!s.ok()) return s;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  const double mb = static_cast<double>(std::filesystem::file_size(path, ec)) / 1e6;
  PruneCheckpoints(dir, keep);
  spdlog::info("checkpoint: {} (round {}, {:.0f} MB in {:.2f} s, {:.0f} MB/s)", path, data.round, ec ? 0.0 : mb,
               seconds, seconds > 0 && !ec ? mb / seconds : 0.0);
  return WrittenCheckpoint{path, data.round};
}

}  // namespace

void EvalHistory::Add(const EvalRecord& record) {
  absl::MutexLock lock(&mu_);
  records_.push_back(record);
}

std::vector<EvalRecord> EvalHistory::Records() const {
  absl::MutexLock lock(&mu_);
  return records_;
}

bool EvalHistory::empty() const {
  absl::MutexLock lock(&mu_);
  return records_.empty();
}

absl::Status ReplayLogSink::OnStart(const ClosedRound& start) {
  if (start.theta->round != 0) return absl::OkStatus();  // resumed: theta_0 was written when the run started
  return WriteReplayTheta0(dir_, fingerprint_, start.theta->params);  // asked for and impossible: a start-up error
}

void ReplayLogSink::OnStepped(const ClosedRound& round) {
  const absl::Status s = WriteReplayDelta(dir_, round.theta->round, fingerprint_, names_, *round.delta);
  if (!s.ok()) spdlog::error("replay log of round {}: {}", round.theta->round, std::string(s.message()));
}

void RoundLogSink::OnCommitted(const ClosedRound& round) {
  spdlog::info("round {}/{} closed ({}): {} pushes, {:.0f} tokens, outer step {:.3f} s, round {:.2f} s",
               round.theta->round, rounds_total_, round.reason, round.pushes, round.tokens, round.step_seconds,
               round.round_seconds);
}

absl::Status EvaluationSink::OnStart(const ClosedRound& start) {
  if (!history_->empty()) return absl::OkStatus();
  try {
    Vet(*start.theta);
  } catch (const NonFiniteStep& e) {  // the starting theta is what it is: logged, not recorded
    spdlog::error("evaluation of round {}: {}", start.theta->round, e.what());
  }
  OnCommitted(start);  // records and logs it
  return absl::OkStatus();
}

double EvaluationSink::Vet(const ParamSnapshot& candidate) {
  vetted_.reset();
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  try {
    loss = evaluator_->Evaluate(candidate.params);
  } catch (const std::exception& e) {
    spdlog::error("evaluation of round {} failed, training goes on: {}", candidate.round, e.what());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!std::isfinite(loss)) {
    throw NonFiniteStep("the evaluation of its stepped theta is not finite (val_loss " + std::to_string(loss) + ")");
  }
  vetted_ = Vetted{candidate.round, loss, seconds};
  return seconds;
}

void EvaluationSink::OnCommitted(const ClosedRound& round) {
  if (vetted_ && vetted_->round == round.theta->round) {
    spdlog::info("eval: round {} val_loss {:.4f} (ppl {:.2f}, {:.2f} s)", vetted_->round, vetted_->loss,
                 std::exp(vetted_->loss), vetted_->seconds);
    history_->Add({vetted_->round, vetted_->loss, round.tokens_committed, round.bytes_pushed_committed});
  }
  vetted_.reset();
}

CheckpointWriter::CheckpointWriter(const Config& config, std::string fingerprint, ThetaStore* theta,
                                   std::shared_ptr<EvalHistory> history, RecordsAt records, std::string members_config)
    : dir_(config.CheckpointDir()),
      every_(config.coordinator.checkpoint_every),
      keep_(config.coordinator.keep_checkpoints),
      fingerprint_(std::move(fingerprint)),
      theta_(theta),
      history_(std::move(history)),
      records_(std::move(records)),
      members_config_(std::move(members_config)) {}

void CheckpointWriter::OnCommitted(const ClosedRound& round) {
  if (!round.theta->complete && (every_ <= 0 || round.theta->round % every_ != 0)) return;
  auto written = Write();
  if (written.ok()) return;
  if (!round.theta->complete) {
    spdlog::error("checkpoint failed, training goes on: {}", std::string(written.status().message()));
    return;
  }
  // The last round's: theta_T exists nowhere else. A few more tries for a passing fault (a full disk being freed).
  for (int attempt = 2; attempt <= 3 && !written.ok(); ++attempt) {
    spdlog::error("the final checkpoint failed (try {} of 3; again in 2 s): {}", attempt - 1,
                  std::string(written.status().message()));
    std::this_thread::sleep_for(std::chrono::seconds(2));  // 4 s in all: within a launcher's 10 s SIGTERM grace
    written = Write();
  }
  if (written.ok()) return;
  absl::MutexLock lock(&mu_);
  final_error_ = std::string(written.status().message());
}

std::string CheckpointWriter::final_error() const {
  absl::MutexLock lock(&mu_);
  return final_error_;
}

absl::StatusOr<WrittenCheckpoint> CheckpointWriter::Write() {
  absl::MutexLock writing(&mu_);
  absl::StatusOr<WrittenCheckpoint> written;
  const absl::Status read = theta_->ReadSteady([&](const SteadyTheta& theta) {
    // An exception (an allocation, a tensor copy, the members' record) is this write's error, as a full disk is:
    // the round thread's caller logs it and, on the last round, tries again and keeps it in final_error().
    try {
      CheckpointData data;
      data.fingerprint = fingerprint_;
      data.round = theta.round;
      data.theta_id = theta.id;
      data.params = theta.params;
      data.momentum = theta.momentum;
      data.evals = history_->Records();
      if (records_) {
        records_(theta.round, data);
        data.members_config = members_config_;
      }
      written = SaveAndLog(dir_, keep_, data);
    } catch (const std::exception& e) {
      written = absl::InternalError(absl::StrCat("checkpoint of round ", theta.round, " in ", dir_, ": ", e.what()));
    }
    return written.status();
  });
  if (!read.ok()) return read;
  return written;
}

}  // namespace diloco
