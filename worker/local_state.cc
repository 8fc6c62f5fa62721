// LocalState (worker/local_state.h): resume at set-up, save after each push, the per-step position journal, the
// window trace and the error feedback.
#include "worker/local_state.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/codec.h"
#include "proto/tensor_spec.h"
#include "worker/lm/language_model.h"

namespace diloco {

int SavedShardHint(const Config& config, const std::string& worker_id, int64_t cluster_size,
                   const std::string& fingerprint) {
  if (!config.workers.resume) return -1;
  auto journal = LoadPosition(PositionPath(config.WorkerStateDir(), StateKey(worker_id, 0, cluster_size)));
  if (!journal.ok()) return -1;
  const StateIdentity& saved = journal->first;
  if (saved.worker_id != worker_id || saved.fingerprint != fingerprint || saved.seed != config.run.seed) return -1;
  return static_cast<int>(saved.shard);
}

std::string SliceLayoutOf(const FlatAdamW& optimizer) {
  const int64_t piece = optimizer.gradient_piece().numel();
  const int64_t parts = piece > 0 ? optimizer.padded_parameters().numel() / piece : 1;
  std::string layout = SliceLayout(optimizer.flat_parameters().numel(), optimizer.sharded(),
                                   optimizer.owns_gradient_slice(), parts, piece);
  // Moments saved before the buffers kept undecayed tensors in model order are in another order: a new name for the
  // layout makes such a state file start its moments fresh (with one line) instead of restoring them misplaced.
  if (optimizer.has_undecayed_segments()) absl::StrAppend(&layout, "; undecayed tensors in model order");
  return layout;
}

StateIdentity IdentityOf(const Config& config, const TokenCache& cache, const std::string& worker_id,
                         InnerTrainer& trainer, int64_t shard_index, int64_t shard_count, int64_t cluster_rank,
                         int64_t cluster_size) {
  return {worker_id,
          Fingerprint(SpecsOf(NamedParameters(*trainer.model()))),
          config.run.seed,
          std::filesystem::path(cache.dir).filename().string(),
          shard_index,
          shard_count,
          std::string(EnumName(config.data.sampling)),
          cluster_rank,
          cluster_size,
          SliceLayoutOf(trainer.optimizer()),
          WindowsOf(config.model.seq_len, std::string(EnumName(config.data.split)), cluster_size)};
}

LocalState::LocalState(const Config& config, InnerTrainer& trainer, StateIdentity identity, int fragments,
                       ShareWithRanks share)
    : config_(config),
      trainer_(trainer),
      identity_(std::move(identity)),
      key_(StateKey(identity_.worker_id, identity_.cluster_rank, identity_.cluster_size)),
      share_(std::move(share)),
      state_dir_(config.WorkerStateDir()) {
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
    if (share_ && config_.workers.resume) ChooseSave({});  // the other ranks wait for this rank's (empty) offer
    return;
  }
  if (config_.workers.resume) Resume();
  if (config_.data.trace_windows) {
    const std::string path = WindowsPath(state_dir_, key_);
    windows_trace_.reset(std::fopen(path.c_str(), "a"));
    if (!windows_trace_) spdlog::warn("data.trace_windows: cannot append to {}", path);
  }
  trainer_.set_window_observer([this](const WindowDraw& w) { OnWindow(w); });
}

void LocalState::OnWindow(const WindowDraw& draw) {
  // After the last window of each batch: first the position journal, then the batch's lines of the trace, so that a
  // kill -9 at any point never leaves a traced window that the restart draws again.
  pending_draws_.push_back(draw);
  if (static_cast<int64_t>(pending_draws_.size()) < config_.inner.batch_size) return;
  absl::Status s = SavePosition(PositionPath(state_dir_, key_), identity_, trainer_.sampler_state());
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

std::vector<WorkerState> LocalState::UsableStates() const {
  std::vector<std::string> paths = {StatePath(state_dir_, key_)};
  if (identity_.cluster_size > 1) paths.push_back(PreviousStatePath(state_dir_, key_));
  std::vector<WorkerState> usable;
  const int64_t moments = trainer_.optimizer().exp_avg().numel();
  for (const std::string& path : paths) {
    absl::StatusOr<WorkerState> saved = LoadWorkerState(path);
    std::string why;
    if (!saved.ok()) {
      if (!absl::IsNotFound(saved.status())) why = std::string(saved.status().message());
    } else if (why = WhyNotResume(saved->identity, identity_); why.empty() && saved->exp_avg.numel() != moments) {
      why = absl::StrCat("its moments have ", saved->exp_avg.numel(), " elements, this optimizer ", moments);
    }
    if (!why.empty()) spdlog::warn("ignoring the saved state {}: {}; not resuming from it", path, why);
    if (saved.ok() && why.empty()) usable.push_back(std::move(*saved));
  }
  return usable;
}

std::optional<SaveMark> LocalState::ChooseSave(const std::vector<WorkerState>& usable) const {
  if (!share_) {
    return usable.empty() ? std::nullopt : std::optional<SaveMark>(SaveMark{usable[0].round, usable[0].adam_steps});
  }
  std::vector<std::string> marks;
  for (const WorkerState& s : usable) marks.push_back(MarkText({s.round, s.adam_steps}));
  std::vector<std::vector<SaveMark>> per_rank;
  for (const std::string& line : share_("resume_marks", absl::StrJoin(marks, ","))) {
    per_rank.emplace_back();
    for (absl::string_view word : absl::StrSplit(line, ',', absl::SkipEmpty())) {
      if (std::optional<SaveMark> mark = ParseMark(word)) per_rank.back().push_back(*mark);
    }
  }
  if (std::all_of(per_rank.begin(), per_rank.end(), [](const auto& marks) { return marks.empty(); })) {
    return std::nullopt;  // no rank has a state: a first start, nothing to say
  }
  const ResumeAgreement agreed = AgreeOnResumeRound(per_rank);
  if (agreed.mark) {
    spdlog::info("cluster rank {}: resuming the optimizer state of {}", identity_.cluster_rank, agreed.reason);
  } else {
    spdlog::warn("cluster rank {}: {}; every rank starts its AdamW moments fresh", identity_.cluster_rank,
                 agreed.reason);
  }
  return agreed.mark;
}

void LocalState::Resume() {
  const std::vector<WorkerState> usable = UsableStates();
  const std::optional<SaveMark> mark = ChooseSave(usable);
  const WorkerState* chosen = nullptr;
  for (const WorkerState& s : usable) {
    if (mark && s.round == mark->round && s.adam_steps == mark->adam_steps && chosen == nullptr) chosen = &s;
  }
  // The journal is newer than the state when the kill came mid-round: its position skips the windows drawn then. A
  // cluster rank whose ranks agreed on no round still resumes its own data position.
  // A position counts windows: under another model.seq_len or data.split it would name other tokens, so it is not
  // resumed (the moments are).
  std::optional<SamplerState> sampler;
  std::string position_differs;
  if (chosen) {
    position_differs = WhyNotResumePosition(chosen->identity, identity_);
    if (position_differs.empty()) sampler = chosen->sampler;
  }
  auto journal = LoadPosition(PositionPath(state_dir_, key_));
  if (journal.ok() && WhyNotResume(journal->first, identity_).empty()) {
    if (std::string why = WhyNotResumePosition(journal->first, identity_); why.empty()) {
      sampler = journal->second;
    } else if (position_differs.empty()) {
      position_differs = why;
    }
  }
  if (!position_differs.empty() && !sampler) {
    spdlog::warn("data position not resumed: {}; the data stream starts over", position_differs);
  }
  if (chosen == nullptr && !sampler) return;
  if (sampler) {
    if (absl::Status s = trainer_.RestoreSampler(*sampler); !s.ok()) {
      spdlog::warn("data position not restored ({}); the data stream starts over", std::string(s.message()));
    }
  }
  const SamplerState at = trainer_.sampler_state();  // where the data stream goes on from (0 when not restored)
  if (chosen == nullptr) {
    spdlog::info("resuming the data position only: epoch {} window {} ({:.3f} epochs)", at.epoch, at.position,
                 trainer_.epochs());
    return;
  }
  trainer_.optimizer().RestoreState(chosen->adam_steps, chosen->exp_avg, chosen->exp_avg_sq);
  RestoreErrorFeedback(chosen->error_feedback);
  resumed_slice_residual_ = chosen->slice_residual;
  resumed_ = true;
  spdlog::info(
      "resuming from {}: last pushed round {}, AdamW step {}, data position epoch {} window {} ({:.3f} epochs)",
      StatePath(state_dir_, key_) + (chosen == &usable[0] ? "" : " (its previous state)"), chosen->round,
      chosen->adam_steps, at.epoch, at.position, trainer_.epochs());
}

void LocalState::Save(int64_t round) {
  if (state_dir_.empty()) return;
  const FlatAdamW& adam = trainer_.optimizer();
  WorkerState state{identity_, round, adam.steps(), trainer_.sampler_state(), adam.exp_avg(), adam.exp_avg_sq(), {}};
  for (const auto& ef : error_feedback_) state.error_feedback.push_back(ef ? ef->Flat() : torch::Tensor());
  if (slice_residual_) state.slice_residual = slice_residual_();
  // A cluster rank keeps its last state as the previous one: the ranks' files then always share a round, even when
  // a kill came between two ranks' writes (AgreeOnResumeRound).
  const std::string path = StatePath(state_dir_, key_);
  if (identity_.cluster_size > 1 && std::filesystem::exists(path)) {
    std::rename(path.c_str(), PreviousStatePath(state_dir_, key_).c_str());
  }
  absl::Status s = SaveWorkerState(path, state);
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

torch::Tensor LocalState::KeepSliceResidual(std::function<torch::Tensor()> current) {
  slice_residual_ = std::move(current);
  return std::exchange(resumed_slice_residual_, torch::Tensor());
}

bool LocalState::Compensate(int fragment, NamedTensors& pseudo_gradient, ErrorFeedback::Sent* sent) {
  ErrorFeedback* ef = error_feedback_[static_cast<size_t>(fragment)].get();
  if (ef == nullptr) return false;
  ef->Compensate(pseudo_gradient, sent);
  return true;
}

void LocalState::SettleFeedback(int fragment, bool counted) {
  if (ErrorFeedback* ef = error_feedback_[static_cast<size_t>(fragment)].get()) ef->Settle(counted);
}

}  // namespace diloco
