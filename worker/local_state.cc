// LocalState (worker/local_state.h): resume at set-up, save after each push, the per-step position journal, the
// window trace and the error feedback.
#include "worker/local_state.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "proto/codec.h"

namespace diloco {

LocalState::LocalState(const Config& config, InnerTrainer& trainer, StateIdentity identity, bool on_disk, int fragments)
    : config_(config), trainer_(trainer), identity_(std::move(identity)), state_dir_(config.WorkerStateDir()) {
  const Codec codec = CodecOf(config_.comm.codec);
  error_feedback_.resize(static_cast<size_t>(fragments));
  if (codec == CODEC_TOPK) {  // SparseLoCo: the error-feedback accumulator is part of the codec
    const TopkParams topk{config_.comm.topk_chunk, config_.comm.topk_per_chunk};
    for (auto& ef : error_feedback_) {
      ef = std::make_unique<ErrorFeedback>(codec, config_.comm.chunk_bytes, topk, config_.comm.error_decay);
    }
  } else if (config_.comm.error_feedback && codec != CODEC_RAW) {
    for (auto& ef : error_feedback_) ef = std::make_unique<ErrorFeedback>(codec, config_.comm.chunk_bytes);
  }
  std::error_code ec;
  std::filesystem::create_directories(state_dir_, ec);
  if (ec) {
    spdlog::warn("workers.state_dir: cannot create '{}' ({}); this worker keeps no local state", state_dir_,
                 ec.message());
    state_dir_.clear();
    return;
  }
  if (!on_disk) {
    spdlog::info("workers.resume: worker clusters do not keep local state yet; every restart starts cold");
    state_dir_.clear();
  } else if (config_.workers.resume) {
    Resume();
  }
  if (config_.data.trace_windows && !state_dir_.empty()) {
    const std::string path = WindowsPath(state_dir_, identity_.worker_id);
    windows_trace_.reset(std::fopen(path.c_str(), "a"));
    if (!windows_trace_) spdlog::warn("data.trace_windows: cannot append to {}", path);
  }
  if (state_dir_.empty()) return;
  trainer_.set_window_observer([this](const WindowDraw& w) { OnWindow(w); });
}

void LocalState::OnWindow(const WindowDraw& draw) {
  // After the last window of each batch: first the position journal, then the batch's lines of the trace, so that a
  // kill -9 at any point never leaves a traced window that the restart draws again.
  pending_draws_.push_back(draw);
  if (static_cast<int64_t>(pending_draws_.size()) < config_.inner.batch_size) return;
  absl::Status s = SavePosition(PositionPath(state_dir_, identity_.worker_id), identity_, trainer_.sampler_state());
  if (!s.ok() && !position_warned_) {
    spdlog::warn("data position not saved: {}", std::string(s.message()));
    position_warned_ = true;
  }
  if (windows_trace_) {
    for (const WindowDraw& d : pending_draws_) {
      std::fprintf(windows_trace_.get(), "%lld %lld\n", static_cast<long long>(d.epoch),
                   static_cast<long long>(d.start));
    }
    std::fflush(windows_trace_.get());  // in the kernel before a kill -9 can lose it
  }
  pending_draws_.clear();
}

void LocalState::Resume() {
  const std::string path = StatePath(state_dir_, identity_.worker_id);
  absl::StatusOr<WorkerState> saved = LoadWorkerState(path);
  if (!saved.ok()) {
    if (!absl::IsNotFound(saved.status())) {
      spdlog::warn("ignoring the saved state: {}; starting cold", std::string(saved.status().message()));
    }
    return;
  }
  if (std::string why = WhyNotResume(saved->identity, identity_); !why.empty()) {
    spdlog::warn("ignoring the saved state {}: {}; starting cold", path, why);
    return;
  }
  try {
    trainer_.optimizer().RestoreState(saved->adam_steps, saved->exp_avg, saved->exp_avg_sq);
  } catch (const std::exception& e) {
    spdlog::warn("ignoring the saved state {}: {}; starting cold", path, e.what());
    return;
  }
  // The journal is newer than the state when the kill came mid-round: its position skips the windows drawn then.
  SamplerState sampler = saved->sampler;
  auto journal = LoadPosition(PositionPath(state_dir_, identity_.worker_id));
  if (journal.ok() && WhyNotResume(journal->first, identity_).empty()) sampler = journal->second;
  if (absl::Status s = trainer_.RestoreSampler(sampler); !s.ok()) {
    spdlog::warn("data position not restored ({}); the data stream starts over", std::string(s.message()));
  }
  RestoreErrorFeedback(saved->error_feedback);
  resumed_ = true;
  spdlog::info(
      "resuming from {}: last pushed round {}, AdamW step {}, data position epoch {} window {} ({:.3f} epochs)", path,
      saved->round, saved->adam_steps, sampler.epoch, sampler.position, trainer_.epochs());
}

void LocalState::Save(int64_t round) {
  if (state_dir_.empty()) return;
  const FlatAdamW& adam = trainer_.optimizer();
  WorkerState state{identity_, round, adam.steps(), trainer_.sampler_state(), adam.exp_avg(), adam.exp_avg_sq(), {}};
  for (const auto& ef : error_feedback_) state.error_feedback.push_back(ef ? ef->Flat() : torch::Tensor());
  absl::Status s = SaveWorkerState(StatePath(state_dir_, identity_.worker_id), state);
  if (!s.ok()) spdlog::warn("local state not saved: {}", std::string(s.message()));
}

void LocalState::BeforeFirstStep() {
  if (!resumed_) return;
  resumed_ = false;
  const FlatAdamW& adam = trainer_.optimizer();
  spdlog::info("first inner step after resume: AdamW step {} from saved moments, |exp_avg| = {:.9g}", adam.steps() + 1,
               adam.exp_avg().norm().item<double>());
}

void LocalState::RestoreErrorFeedback(const std::vector<torch::Tensor>& saved) {
  int restored = 0;
  for (size_t f = 0; f < saved.size() && f < error_feedback_.size(); ++f) {
    if (!saved[f].defined() || !error_feedback_[f]) continue;
    error_feedback_[f]->Restore(saved[f]);
    ++restored;
  }
  if (restored > 0) spdlog::info("error feedback: restored the residual of {} fragment(s)", restored);
}

bool LocalState::Compensate(int fragment, NamedTensors& pseudo_gradient, ErrorFeedback::Sent* sent) {
  ErrorFeedback* ef = error_feedback_[static_cast<size_t>(fragment)].get();
  if (ef == nullptr) return false;
  ef->Compensate(pseudo_gradient, sent);
  return true;
}

}  // namespace diloco
