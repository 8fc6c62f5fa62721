#include "coordinator/bootstrap.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"

namespace diloco {

absl::Status CheckTheta0(const NamedTensors& theta_0) {
  if (theta_0.empty()) return absl::InvalidArgumentError("theta_0 holds no tensors");
  std::set<std::string> names;
  for (const auto& [name, t] : theta_0) {
    if (name.empty() || !names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("theta_0: tensor name '", name, "' is empty or repeated"));
    }
    if (!t.defined() || t.scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat("theta_0: tensor '", name, "' is not a float32 tensor"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Replaces `boot` with the newest valid checkpoint in the checkpoint directory, if there is one.
absl::Status Resume(const Config& config, const std::string& fingerprint, BootState& boot) {
  std::vector<std::string> skipped;
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = LoadNewestCheckpoint(config.CheckpointDir(), &skipped);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& why : skipped) spdlog::warn("skipping checkpoint: {}", why);
  if (!loaded.ok()) {
    if (loaded.status().code() != absl::StatusCode::kNotFound) return loaded.status();  // one that cannot be read
    if (!skipped.empty()) {
      spdlog::warn("no valid checkpoint to resume from in {}; starting from theta_0", config.CheckpointDir());
    }
    return absl::OkStatus();
  }
  if (loaded->data.fingerprint != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "coordinator.checkpoint_dir: ", loaded->path, " is a checkpoint of another model (fingerprint ",
        loaded->data.fingerprint, ", this model ", fingerprint, "); start with --fresh or set another checkpoint_dir"));
  }
  std::error_code ec;
  const double mb = static_cast<double>(std::filesystem::file_size(loaded->path, ec)) / 1e6;
  spdlog::info("checkpoint loaded: {} ({:.0f} MB in {:.2f} s, {:.0f} MB/s)", loaded->path, ec ? 0.0 : mb, seconds,
               seconds > 0 && !ec ? mb / seconds : 0.0);
  ParamSnapshot& snapshot = *boot.snapshot;
  snapshot.params = std::move(loaded->data.params);
  snapshot.round = loaded->data.round;
  snapshot.id = loaded->data.theta_id;
  snapshot.complete = snapshot.round >= config.SyncRounds();
  boot.momentum = std::move(loaded->data.momentum);
  boot.evals = std::move(loaded->data.evals);
  boot.members_config = std::move(loaded->data.members_config);
  boot.members = std::move(loaded->data.members);
  boot.earlier_theta_ids = std::move(loaded->data.earlier_theta_ids);
  if (loaded->data.totals) {  // the totals go on from the checkpoint (version 5)
    boot.tokens_committed = loaded->data.totals->tokens_committed;
    boot.bytes_pushed_committed = loaded->data.totals->bytes_pushed_committed;
    boot.dp_equivalent_bytes = loaded->data.totals->dp_equivalent_bytes;
  } else if (!boot.evals.empty() && boot.evals.back().round == snapshot.round) {  // older files: the newest eval's
    boot.tokens_committed = boot.evals.back().tokens;
    boot.bytes_pushed_committed = boot.evals.back().bytes_pushed_committed;
  }
  if (snapshot.complete) {
    spdlog::warn(
        "the run in {} is already complete (round {} of {}); nothing to train. Start over "
        "with --fresh, or raise outer.rounds to continue it",
        config.CheckpointDir(), snapshot.round, config.SyncRounds());
  }
  spdlog::info("resumed from {}: round {}, {} evals{}", loaded->path, snapshot.round, boot.evals.size(),
               skipped.empty() ? "" : absl::StrCat(" (", skipped.size(), " newer file(s) skipped as corrupt)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BootState> Bootstrap(const Config& config, NamedTensors theta_0, const std::string& fingerprint,
                                    bool resume) {
  BootState boot;
  boot.snapshot = std::make_shared<ParamSnapshot>();
  boot.snapshot->params = std::move(theta_0);
  if (resume) {
    absl::Status s = Resume(config, fingerprint, boot);
    if (!s.ok()) return s;
  }
  return boot;
}

absl::Status PrepareCheckpointDir(const Config& config, bool fresh) {
  const std::string dir = config.CheckpointDir();
  if (const int removed = RemoveUnfinishedCheckpoints(dir); removed > 0) {
    spdlog::info("removed {} unfinished checkpoint file(s) (*.bin.tmp: a save stopped before its rename) in {}",
                 removed, dir);
  }
  if (!fresh) return absl::OkStatus();
  auto aside = SetAsideCheckpoints(dir);
  if (!aside.ok()) return aside.status();
  if (!aside->empty()) spdlog::warn("--fresh: the earlier run's checkpoints in {} were moved to {}", dir, *aside);
  return absl::OkStatus();
}

}  // namespace diloco
