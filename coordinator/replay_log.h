// ReplayLog: what a run needs so that its final parameters can be recomputed from outside (config key
// coordinator.replay_log_dir, off when empty; scripts/bench/chaos replays it through torch.optim.SGD).
// Files, each in the checkpoint format (proto/checkpoint.h: atomic tmp + fsync + rename, checksummed), no momentum:
//   <dir>/theta0.bin             theta_0 (round 0), written when a run starts from theta_0 (not when it resumes)
//   <dir>/delta-<round:08>.bin   the averaged pseudo-gradient the outer step of that round consumed (synchronous
//                                rounds), written after the step from the accumulator's tensor before it is zeroed
//                                (no extra copy of the model). A round re-run after a coordinator restart
//                                overwrites its file, so the directory always holds the rounds that were committed
//                                last, and a kill never leaves a torn file.
// Replay: theta_R = SGD(nesterov)(theta0, delta-1 .. delta-R) with outer.lr and outer.momentum.
// Stateless functions; thread-safe for distinct rounds (the coordinator's round thread alone writes them).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/checkpoint.h"
#include "proto/named_tensors.h"

namespace diloco {

// "<dir>/theta0.bin"
std::string ReplayTheta0Path(const std::string& dir);
// "<dir>/delta-<round, 8 digits>.bin"
std::string ReplayDeltaPath(const std::string& dir, int64_t round);

// Writes theta_0 (creating `dir` if needed).
absl::Status WriteReplayTheta0(const std::string& dir, const std::string& fingerprint, const NamedTensors& theta_0);
// Writes round `round`'s averaged pseudo-gradient; `names`: the parameter names in the order of `delta`.
absl::Status WriteReplayDelta(const std::string& dir, int64_t round, const std::string& fingerprint,
                              const std::vector<std::string>& names, const std::vector<at::Tensor>& delta);

}  // namespace diloco
