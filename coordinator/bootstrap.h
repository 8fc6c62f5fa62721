// Bootstrap: the state a coordinator run starts from. theta_0 is handed in by the core's creator (the model host,
// model_host.h, builds it from model: and run.seed, or loads model.init_from); with `resume`, the newest valid
// checkpoint in coordinator.checkpoint_dir replaces it (theta_t, outer momentum, round, eval history and the running
// totals); corrupt files are skipped with a warning, a checkpoint of another model is an error. PrepareCheckpointDir
// tidies the directory once the coordinator holds its port (so a start that fails, e.g. next to a coordinator still
// serving the run, touches nothing): the *.bin.tmp files of a save that was killed go, and with --fresh the
// checkpoints already there are moved aside (SetAsideCheckpoints), so the new run's are the only ones pruned and
// resumed.
// Stateless functions (file reads only); thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "coordinator/theta_store.h"
#include "proto/checkpoint.h"

namespace diloco {

struct BootState {
  std::shared_ptr<ParamSnapshot> snapshot;  // theta_0 at round 0, or theta_t of the checkpoint
  std::vector<at::Tensor> momentum;         // outer momentum of the checkpoint (empty: none yet)
  std::vector<EvalRecord> evals;
  // Totals carried on from the checkpoint (its run totals; a file before version 5: its newest eval's, when of its
  // round, and no data-parallel figure).
  int64_t tokens_committed = 0;
  int64_t bytes_pushed_committed = 0;
  int64_t dp_equivalent_bytes = 0;
  std::string members_config;                    // the checkpoint's active members and the config they joined under
  std::vector<MemberRecord> members;             // (CoordinatorCore::RestoreMembers)
  std::vector<ThetaIdRecord> earlier_theta_ids;  // the checkpoint's (CheckpointData::earlier_theta_ids)
};

// theta_0 must be a non-empty list of defined float32 tensors with distinct, non-empty names.
absl::Status CheckTheta0(const NamedTensors& theta_0);

// `fingerprint`: Fingerprint(SpecsOf(theta_0)), which a resumed checkpoint must match.
absl::StatusOr<BootState> Bootstrap(const Config& config, NamedTensors theta_0, const std::string& fingerprint,
                                    bool resume);

// After the listeners are bound, before serving: see above. An error when the checkpoints cannot be moved aside.
absl::Status PrepareCheckpointDir(const Config& config, bool fresh);

}  // namespace diloco
