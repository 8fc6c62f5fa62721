#include "coordinator/replay_log.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace diloco {
namespace {

absl::Status Write(const std::string& dir, const std::string& path, CheckpointData data) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("coordinator.replay_log_dir: cannot create ", dir, ": ", ec.message()));
  return SaveCheckpoint(path, data);
}

}  // namespace

std::string ReplayTheta0Path(const std::string& dir) { return dir + "/theta0.bin"; }

std::string ReplayDeltaPath(const std::string& dir, int64_t round) {
  return absl::StrFormat("%s/delta-%08d.bin", dir, round);
}

absl::Status WriteReplayTheta0(const std::string& dir, const std::string& fingerprint, const NamedTensors& theta_0) {
  CheckpointData data;
  data.round = 0;
  data.fingerprint = fingerprint;
  data.params = theta_0;
  return Write(dir, ReplayTheta0Path(dir), std::move(data));
}

absl::Status WriteReplayDelta(const std::string& dir, int64_t round, const std::string& fingerprint,
                              const std::vector<std::string>& names, const std::vector<at::Tensor>& delta) {
  if (names.size() != delta.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay log: ", names.size(), " names for ", delta.size(), " tensors"));
  }
  CheckpointData data;
  data.round = round;
  data.fingerprint = fingerprint;
  for (size_t i = 0; i < delta.size(); ++i) data.params.emplace_back(names[i], delta[i]);
  return Write(dir, ReplayDeltaPath(dir, round), std::move(data));
}

}  // namespace diloco
